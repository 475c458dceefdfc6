"""The one byte formatter and the one table printer every report uses."""

from loadkit.fmt import format_bytes, plural, table, wrap


def test_format_bytes_three_significant_figures_in_binary_units():
    cases = {
        0: "0 B",
        1023: "1023 B",
        1024: "1 KiB",
        1536: "1.5 KiB",
        8192: "8 KiB",
        97880: "95.6 KiB",  # the Gemma4-like checkpoint cloned whole (notebook 01)
        3 * 2**20: "3 MiB",
        10238175270: "9.54 GiB",  # the full-scale Gemma4-E2B approximation
        64 << 30: "64 GiB",
        5 << 60: "5120 PiB",  # the last unit grows, never wraps
    }
    assert {n: format_bytes(n) for n in cases} == cases


def test_format_bytes_never_prints_an_exponent_just_under_the_next_unit():
    # ``.3g`` alone prints 1000.5 KiB as "1e+03 KiB"; whole numbers from 100 up avoid it.
    assert format_bytes(1000 * 1024 + 512) == "1000 KiB"
    assert format_bytes(1023 * 1024) == "1023 KiB"
    assert format_bytes(int(99.94 * 1024)) == "99.9 KiB"
    assert all("e" not in format_bytes(n) for n in range(1, 1 << 40, 9_999_991_111))


def test_table_pads_to_the_widest_cell_and_strips_trailing_spaces():
    out = table(
        [("a", 1, "x"), ("bbbb", 22, "")],
        header=("name", "n", "note"),
        align="lr",
        rule=True,
        indent="  ",
    )
    assert out.splitlines() == [
        "  name   n  note",
        "  ----  --  ----",
        "  a      1  x",
        "  bbbb  22",
    ]


def test_table_minimum_widths_and_short_rows():
    out = table([("a", "b"), ("c",)], min_widths=(3, 4), align="rr")
    assert out.splitlines() == ["  a     b", "  c"]
    assert table([]) == ""


def test_plural_is_singular_only_for_one():
    assert [plural(n, "key") for n in (0, 1, 2)] == ["0 keys", "1 key", "2 keys"]
    assert plural(1, "pass", "passes") == "1 pass" and plural(3, "pass", "passes") == "3 passes"


def test_wrap_keeps_a_count_with_its_noun():
    # the verdict of a GPT-2 whose c_fc is transposed folded between "1" and "mismatched"
    line = (
        "vllm: would NOT load (2 missing: model.h.0.attn.c_attn.bias, model.h.1.attn.c_attn.bias;"
        " 1 mismatched: model.h.0.mlp.c_fc.weight)"
    )
    assert wrap(line).splitlines() == [
        "vllm: would NOT load (2 missing: model.h.0.attn.c_attn.bias, model.h.1.attn.c_attn.bias;",
        "        1 mismatched: model.h.0.mlp.c_fc.weight)",
    ]
    assert wrap("x; 9 missing y", width=5).splitlines() == ["x;", "    9 missing", "    y"]
    # a number after a word numbers it, and stays with it (notebook 05's "rank 3")
    assert wrap("bias; rank 3 TensorParallelError: x", width=20).splitlines() == [
        "bias; rank 3",
        "        TensorParallelError:",
        "        x",
    ]
    # only a number standing alone is a count: a shape still folds inside
    assert wrap("shape [32, 128] ok", width=11).splitlines() == ["shape [32,", "    128] ok"]
