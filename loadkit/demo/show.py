"""Tables for notebooks: an HTML table where a browser renders the output, compact text elsewhere.

A wide plain-text table wraps every row in two in a notebook and on a code host. ``Table``
renders as an HTML table in JupyterLab, nbviewer and on a code host; its ``text/plain`` (what nbval
and a terminal see) is the aligned table when it fits ``MAX_COLUMNS``, else one row per line with
`` | `` between cells, folded at the width. ``str(table)`` is always the full aligned text.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

from loadkit.demo.saved import MAX_COLUMNS
from loadkit.fmt import table, wrap


@dataclass(frozen=True, repr=False)
class Table:
    """Rows under a header, with notes after them; shown as HTML in a notebook.

    >>> t = Table(("name", "bytes"), [("embed", 4096), ("lm_head", 128)], align="lr")
    >>> print(t)
    name     bytes
    embed     4096
    lm_head    128
    >>> t.column("bytes")
    ['4096', '128']
    """

    header: Sequence[str]
    rows: Sequence[Sequence[object]]
    notes: Sequence[str] = ()  # lines after the table ("... 25 more", a conclusion)
    align: str = ""  # one letter per column, "l" or "r" (fmt.table's convention)

    def cells(self) -> list[list[str]]:
        return [[str(c) for c in row] for row in self.rows]

    def column(self, name: str) -> list[str]:
        """The cells under header ``name``, as text."""
        i = list(self.header).index(name)
        return [row[i] if i < len(row) else "" for row in self.cells()]

    def row(self, first: str) -> list[str]:
        """The first row whose first cell is ``first``, as text (``KeyError`` if none)."""
        for row in self.cells():
            if row and row[0] == first:
                return row
        raise KeyError(first)

    def tail(self, n: int) -> Table:
        """The last ``n`` rows under the same header, with the notes."""
        return Table(self.header, list(self.rows)[-n:], self.notes, self.align)

    def __str__(self) -> str:
        return "\n".join([table(self.rows, header=self.header, align=self.align), *self.notes])

    def __repr__(self) -> str:
        full = str(self)
        if max(map(len, full.split("\n")), default=0) <= MAX_COLUMNS:
            return full
        lines = [" | ".join(self.header)] + [" | ".join(r) for r in self.cells()]
        return wrap("\n".join([*lines, *self.notes]), MAX_COLUMNS)

    def _repr_html_(self) -> str:
        def tr(cells: Sequence[str], tag: str) -> str:
            tds = "".join(
                f'<{tag} style="text-align:{"right" if self.align[i : i + 1] == "r" else "left"}">'
                f"{_breakable(c)}</{tag}>"
                for i, c in enumerate(cells)
            )
            return f"<tr>{tds}</tr>"

        body = "".join(tr(r, "td") for r in self.cells())
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in self.notes)
        return (
            f"<table><thead>{tr(list(self.header), 'th')}</thead><tbody>{body}</tbody></table>"
            + notes
        )


_NAME_DOT = re.compile(r"(?<=[A-Za-z_])\.|\.(?=[A-Za-z_])")


_SHORT = 28  # characters: a cell this short stays on one line


def _breakable(cell: str) -> str:
    """Escaped; a long cell gets a line-break opportunity at each dot of a dotted name (not in
    numbers), so long parameter names wrap inside their column instead of widening the table."""
    text = html.escape(cell)
    return text if len(cell) <= _SHORT else _NAME_DOT.sub(".<wbr>", text)
