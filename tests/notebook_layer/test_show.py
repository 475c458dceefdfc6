"""Notebook text that fits: ``fmt.wrap``, ``Record.summary`` and ``demo.show.Table``."""

from html.parser import HTMLParser

from loadkit.fmt import wrap
from loadkit_notebooks.scenario import Record
from loadkit_notebooks.show import Table

KEY = "model.layers.layers.0.mixer.in_proj.weight"  # 42 characters


def test_wrap_continues_under_the_second_word_and_keeps_words_whole():
    text = "short line\n  mapper  " + " ".join([KEY] * 3) + "\n" + "-" * 120
    assert wrap(text, 100).split("\n") == [
        "short line",
        f"  mapper  {KEY} {KEY}",
        f"            {KEY}",  # under the second word (column 10), two further in
        "-" * 120,  # one word: never split
    ]


def test_wrap_falls_back_to_the_indent_plus_hang():
    # The second word starts past half the width: continue 4 right of the indent instead.
    line = "    " + "x" * 40 + " " + " ".join(["word"] * 20)
    assert wrap(line, 60).split("\n") == [
        "    " + "x" * 40 + " word word word",
        "        word word word word word word word word word word",
        "        word word word word word word word",
    ]
    assert wrap("  a " + "bb " * 10, 14, hang=1).split("\n") == [
        "  a bb bb bb",
        "   bb bb bb bb",
        "   bb bb bb",
    ]


def test_wrap_continues_a_tree_line_under_its_branch():
    assert wrap("├── label " + "word " * 8, 30).split("\n") == [
        "├── label word word word word",
        "│           word word word",
        "│           word",
    ]
    assert wrap("└── label " + "word " * 8, 30).split("\n")[1] == "            word word word"


def test_wrap_keeps_blank_lines_and_expands_tabs():
    assert wrap(" " * 120 + "\nx", 100) == "\nx"  # a blank line stays a line
    assert wrap("│   " * 30, 100) == ("│   " * 30).rstrip()  # one word's worth: left whole
    assert wrap("a\tb", 100) == "a       b"


def test_summary_pads_keys_up_to_a_third_and_folds_values_under_their_start():
    r = Record(
        "new",
        outcome={
            "a" * 40: "short",
            "b": "x " * 50,
            "held": "line one\nline two",
            "c" * 40: "word " * 20,
        },
    )
    assert r.summary(width=60).split("\n") == [
        "[new]",
        "  " + "a" * 40 + " : short",
        "  b" + " " * 19 + " : " + "x " * 17 + "x",
        " " * 25 + "x " * 17 + "x",
        " " * 25 + "x " * 13 + "x",
        "  held" + " " * 16 + " : line one",
        " " * 25 + "line two",
        "  " + "c" * 40 + " :",  # key and value do not fit on one line: the value goes under
        " " * 25 + "word " * 6 + "word",
        " " * 25 + "word " * 6 + "word",
        " " * 25 + "word " * 5 + "word",
    ]


def test_a_narrow_table_is_its_aligned_text():
    t = Table(("name", "bytes"), [("embed", 4096), ("lm_head", 128)], ["2 tensors"], align="lr")
    assert t.text() == str(t) == "name     bytes\nembed     4096\nlm_head    128\n2 tensors"
    assert t.row("lm_head") == ["lm_head", "128"] and t.column("bytes") == ["4096", "128"]
    assert t.tail(1).cells() == [["lm_head", "128"]] and t.tail(1).notes == ["2 tensors"]
    assert repr(t) == "Table(2 columns, 2 rows, 1 notes)"
    # A long note is folded on its own and leaves the table aligned.
    noted = Table(("a", "b"), [("1", "2")], ["note " * 30])
    assert noted.text(40).split("\n")[:2] == ["a  b", "1  2"]
    assert max(len(line) for line in noted.text(40).split("\n")) <= 40


def test_a_wide_table_folds_between_cells_only():
    rows = [(KEY, "Plamo2Model.load_weights", KEY[6:], KEY[6:], "via model")]
    t = Table(("checkpoint name", "handled by", "name it sees", "parameter", "done"), rows)
    assert len(str(t).split("\n")[1]) > 100
    assert t.text(100).split("\n") == [
        "checkpoint name | handled by | name it sees | parameter | done",
        f"{KEY} | Plamo2Model.load_weights",
        f"    | {KEY[6:]} | {KEY[6:]} | via model",  # "via model" stays one cell
    ]


class _Cells(HTMLParser):
    """(tag, text) of each th, td and p, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("th", "td", "p"):
            self.cells.append((tag, ""))

    def handle_data(self, data):
        if self.cells and data.strip():
            tag, text = self.cells[-1]
            self.cells[-1] = (tag, text + data)


def test_html_has_every_cell_escaped_a_row_a_line():
    t = Table(("name", "<b>"), [("a.<in>", "1"), ("short row",)], ["n < m"], align="lr")
    page = t._repr_html_()
    parser = _Cells()
    parser.feed(page)
    assert parser.cells == [
        ("th", "name"), ("th", "<b>"),
        ("td", "a.<in>"), ("td", "1"),
        ("td", "short row"), ("td", ""),
        ("p", "n < m"),
    ]  # fmt: skip
    assert "<b>" not in page and "&lt;b&gt;" in page
    assert '<td style="text-align:right">1</td>' in page
    assert [line for line in page.split("\n") if line.startswith("<tr>")] == [
        '<tr><th style="text-align:left">name</th><th style="text-align:right">&lt;b&gt;</th></tr>',
        '<tr><td style="text-align:left">a.&lt;in&gt;</td><td style="text-align:right">1</td></tr>',
        '<tr><td style="text-align:left">short row</td><td style="text-align:right"></td></tr>',
    ]


def test_long_names_may_break_after_their_dots_numbers_never():
    t = Table(("a", "b"), [("layers.0.mixer.A_log.weight +0.0894", "Plamo2Model.load")])
    page = t._repr_html_()
    assert ">layers.<wbr>0.<wbr>mixer.<wbr>A_log.<wbr>weight +0.0894<" in page
    assert ">Plamo2Model.load<" in page  # short: kept on one line
