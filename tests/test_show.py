"""Notebook text that fits: ``fmt.wrap`` and ``demo.show.Table``."""

from html.parser import HTMLParser

from loadkit.demo.show import MAX_COLUMNS, Table
from loadkit.fmt import wrap


def test_wrap_folds_at_spaces_loses_nothing_and_keeps_long_words_whole():
    key = "model.layers.layers.0.mixer.in_proj.weight"
    text = "short line\n  " + " ".join([key] * 5) + "\n" + "-" * 120
    out = wrap(text, 100)
    lines = out.split("\n")
    assert lines[0] == "short line"
    assert lines[-1] == "-" * 120  # one word: never split
    folded = lines[1:-1]
    assert len(folded) == 3 and all(len(line) <= 100 for line in folded)
    assert all(line.startswith("      " + key) for line in folded[1:])  # indent 2 + hang 4
    assert out.split() == text.split()


def test_wrap_continues_a_tree_line_under_its_branch():
    out = wrap("├── " + "word " * 30, 40).split("\n")
    assert out[0].startswith("├── word") and all(line.startswith("│       w") for line in out[1:])
    out = wrap("└── " + "word " * 30, 40).split("\n")
    assert all(line.startswith("        w") for line in out[1:])


def test_a_narrow_table_is_its_aligned_text():
    t = Table(("name", "bytes"), [("embed", 4096), ("lm_head", 128)], ["2 tensors"], align="lr")
    assert repr(t) == str(t) == "name     bytes\nembed     4096\nlm_head    128\n2 tensors"
    assert t.row("lm_head") == ["lm_head", "128"] and t.column("bytes") == ["4096", "128"]
    assert t.tail(1).cells() == [["lm_head", "128"]] and t.tail(1).notes == ["2 tensors"]


class _Cells(HTMLParser):
    """(tag, text) of each th, td and p, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("th", "td", "p"):
            self.cells.append((tag, ""))

    def handle_data(self, data):
        tag, text = self.cells[-1]
        self.cells[-1] = (tag, text + data)


def test_a_wide_table_prints_rows_that_fit_and_renders_every_cell_in_html():
    name = "model.layers.layers.0.mixer.<in_proj>.weight"
    rows = [(f"{name}.{i}", "handled by Plamo2Model.load_weights", name * 2) for i in range(3)]
    t = Table(("checkpoint name", "handled by", "parameter"), rows, ["... 2 more"])
    assert max(len(line) for line in str(t).split("\n")) > MAX_COLUMNS
    text = repr(t)
    assert all(len(line) <= MAX_COLUMNS for line in text.split("\n") if " " in line.strip())
    assert text.split("\n")[0] == "checkpoint name | handled by | parameter"
    assert (
        text.split()
        == " ".join(
            ["checkpoint name | handled by | parameter"]
            + [" | ".join(r) for r in rows]
            + ["... 2 more"]
        ).split()
    )  # every cell is there, in order
    parser = _Cells()
    parser.feed(t._repr_html_())
    assert parser.cells == [
        ("th", "checkpoint name"), ("th", "handled by"), ("th", "parameter"),
        *[("td", c) for r in rows for c in r],
        ("p", "... 2 more"),
    ]  # fmt: skip
    assert "<in_proj>" not in t._repr_html_()  # escaped
    # Long names may break after their dots, numbers never.
    cells = Table(("a", "b"), [("layers.0.mixer.A_log.weight +0.0894", "Plamo2Model.load")])
    html = cells._repr_html_()
    assert ">layers.<wbr>0.<wbr>mixer.<wbr>A_log.<wbr>weight +0.0894<" in html
    assert ">Plamo2Model.load<" in html  # short: kept on one line
