"""Tables for notebooks: an HTML table where a browser renders the output, compact text elsewhere.

A wide plain-text table wraps every row in two in a notebook and on a code host. ``Table``
renders as an HTML table in JupyterLab, nbviewer and on a code host. Its text (``text/plain``,
what nbval and a terminal see; ``Table.text()``) is the aligned table when that fits
``fmt.WIDTH`` columns, else one row per line with `` | `` between cells, folded only between
cells. ``str(table)`` is always the full aligned text.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loadkit.fmt import WIDTH, table, wrap


@dataclass(frozen=True, eq=False, repr=False)
class Table:
    """Rows under a header, with notes after them; shown as HTML in a notebook.

    >>> t = Table(("name", "bytes"), [("embed", 4096), ("lm_head", 128)], ["2 tensors"], "lr")
    >>> print(t)
    name     bytes
    embed     4096
    lm_head    128
    2 tensors
    >>> t
    Table(2 columns, 2 rows, 1 notes)
    """

    header: Sequence[str]
    rows: Sequence[Sequence[object]]
    notes: Sequence[str] = ()  # lines after the table ("... 25 more", a conclusion)
    align: str = ""  # one letter per column, "l" or "r" (fmt.table's convention)

    def cells(self) -> list[list[str]]:
        """Every row as text, padded with empty cells to the header's width.

        >>> Table(("a", "b"), [(1,), (2, 3)]).cells()
        [['1', ''], ['2', '3']]
        """
        n = len(self.header)
        return [[str(c) for c in row] + [""] * (n - len(row)) for row in self.rows]

    def column(self, name: str) -> list[str]:
        """The cells under header ``name`` (``KeyError`` if there is none).

        >>> Table(("name", "bytes"), [("embed", 4096)]).column("bytes")
        ['4096']
        """
        if name not in self.header:
            raise KeyError(name)
        i = list(self.header).index(name)
        return [row[i] for row in self.cells()]

    def row(self, first: str) -> list[str]:
        """The first row whose first cell is ``first`` (``KeyError`` if there is none).

        >>> Table(("name", "bytes"), [("embed", 4096)]).row("embed")
        ['embed', '4096']
        """
        for row in self.cells():
            if row[0] == first:
                return row
        raise KeyError(first)

    def tail(self, n: int) -> Table:
        """The last ``n`` rows under the same header, with the notes.

        >>> Table(("name",), [("a",), ("b",)]).tail(1).cells()
        [['b']]
        """
        return Table(self.header, list(self.rows)[-n:], self.notes, self.align)

    def text(self, width: int = WIDTH) -> str:
        """The table as text within ``width`` columns where its cells allow (see the module)."""
        aligned = table(self.rows, header=self.header, align=self.align)
        if max(map(len, aligned.split("\n")), default=0) > width:
            rows = [list(self.header), *self.cells()]
            aligned = "\n".join(_joined(r, width) for r in rows)
        return "\n".join([aligned, *(wrap(n, width) for n in self.notes)])

    def __str__(self) -> str:
        return "\n".join([table(self.rows, header=self.header, align=self.align), *self.notes])

    def __repr__(self) -> str:
        shape = f"{len(self.header)} columns, {len(self.rows)} rows, {len(self.notes)} notes"
        return f"Table({shape})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text())  # IPython's text/plain: what nbval compares

    def _repr_html_(self) -> str:
        def tr(cells: Sequence[str], tag: str) -> str:
            # JupyterLab's stylesheet right-aligns output tables; say each column's side.
            sides = ["right" if self.align[i : i + 1] == "r" else "left" for i in range(len(cells))]
            tds = "".join(
                f'<{tag} style="text-align:{side}">{_breakable(c)}</{tag}>'
                for side, c in zip(sides, cells, strict=True)
            )
            return f"<tr>{tds}</tr>\n"  # a row a line: readable diffs (nbval and git compare it)

        body = "".join(tr(r, "td") for r in self.cells())
        notes = "".join(f"<p>{html.escape(n, quote=False)}</p>\n" for n in self.notes)
        head = tr(list(self.header), "th")
        return f"<table>\n<thead>\n{head}</thead>\n<tbody>\n{body}</tbody>\n</table>\n{notes}"


def _joined(cells: Sequence[str], width: int) -> str:
    """Cells joined by `` | ``, folded between cells (never inside one) at ``width``."""
    lines = [cells[0]]
    for cell in cells[1:]:
        if len(lines[-1]) + 3 + len(cell) <= width:
            lines[-1] += " | " + cell
        else:
            lines.append("    | " + cell)
    return "\n".join(lines)


# A dot inside a name (after or before a letter), not a decimal point.
_NAME_DOT = re.compile(r"(?<=[A-Za-z_])\.|\.(?=[A-Za-z_])")
_SHORT = 28  # characters: a cell this short stays on one line


def _breakable(cell: str) -> str:
    """Escaped; a long cell gets a line-break opportunity at each dot of a dotted name (not in
    numbers), so long parameter names wrap inside their column instead of widening the table."""
    text = html.escape(cell, quote=False)
    return text if len(cell) <= _SHORT else _NAME_DOT.sub(".<wbr>", text)


# JupyterLab styles an output's <pre> with ``word-break: break-all``: a line a little wider than
# the output area breaks inside a word ("check" / "point"). Text shown in an HTML widget keeps
# its lines whole instead, and scrolls sideways when the area is narrower.
PRE_STYLE = "white-space: pre; word-break: normal; overflow-wrap: normal; overflow-x: auto"


def pre(text: str) -> str:
    """``text`` as an HTML ``<pre>`` whose lines never break inside a word.

    >>> pre("a < b").endswith('normal; overflow-x: auto">a &lt; b</pre>')
    True
    """
    return f'<pre style="{PRE_STYLE}">{html.escape(text)}</pre>'
