"""What every section's text shares (loadkit_inspect.report.text)."""

from loadkit_inspect.report.text import capped, joined_names, joined_problems, shapes


def test_a_list_is_capped_at_limit_rows_and_says_how_many_more():
    rows = [f"    row {i}" for i in range(5)]
    assert capped(rows, 5, 5) == rows  # exactly the limit: nothing more to say
    assert capped(rows, 5, 3) == [*rows[:3], "    ... 2 more (--json lists them all)"]
    assert capped(rows, 5, 0) == ["    5 rows, none shown (--json lists them all)"]
    assert capped(rows[:1], 1, 0, "  ") == ["  1 row, none shown (--json lists them all)"]
    # ``total`` counts rows the caller never spelled (200,000 unexpected names: only the shown)
    assert capped(rows[:2], 200_000, 2)[-1] == "    ... 199998 more (--json lists them all)"


def test_names_and_problems_are_printed_escaped():
    assert joined_names(["a\nb", "c\x1b[31m"]) == "a\\nb, c\\x1b[31m"
    assert joined_problems(["1 unexpected: x\ty", "raises"]) == "1 unexpected: x\\ty; raises"


def test_a_shape_mismatch_reads_checkpoint_first_and_flags_a_transpose_of_a_matrix_only():
    assert shapes((128, 32), (32, 128)) == "checkpoint [128, 32], model [32, 128] (transposed?)"
    assert shapes((2, 3, 4), (4, 3, 2)) == "checkpoint [2, 3, 4], model [4, 3, 2]"
    assert shapes((8,), None) == "checkpoint [8], model ?"
