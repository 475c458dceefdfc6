"""Text for people: one byte formatter, one plural, one plain-text table printer and one wrap,
used by every report.

Torch-free and import-light: the header-only inspector renders with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


__all__ = [
    "WIDTH",
    "format_bytes",
    "plural",
    "table",
    "wrap",
]


def format_bytes(n: int) -> str:
    """A byte count in binary units with three significant figures.

    Args:
        n: a number of bytes (``0`` or more).

    Returns:
        ``"768 B"`` below 1 KiB, else the value in the largest unit that keeps it under 1024,
        rounded to three significant figures without trailing zeros (``"95.6 KiB"``,
        ``"9.54 GiB"``, ``"64 GiB"``), or to a whole number at 100 and above (``"1000 KiB"``).

    >>> [format_bytes(n) for n in (768, 1536, 97880, 10238175270, 64 << 30)]
    ['768 B', '1.5 KiB', '95.6 KiB', '9.54 GiB', '64 GiB']
    """
    if n < 1024:
        return f"{n} B"
    value = float(n)
    unit = _UNITS[0]
    for unit in _UNITS:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            break
    if value >= 99.95:  # three figures need no decimals (and ``.3g`` would print ``1e+03``)
        return f"{value:.0f} {unit}"
    return f"{value:.3g} {unit}"


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and its noun, singular for 1 and plural otherwise (``many``, else ``noun + "s"``):
    every count a report prints goes through it.

    >>> plural(1, "key"), plural(0, "key"), plural(3, "revision"), plural(2, "index", "indices")
    ('1 key', '0 keys', '3 revisions', '2 indices')
    """
    return f"{n} {noun if n == 1 else many or noun + 's'}"


def table(
    rows: Sequence[Sequence[object]],
    *,
    header: Sequence[str] | None = None,
    align: str = "",
    rule: bool = False,
    indent: str = "",
    min_widths: Sequence[int] = (),
) -> str:
    """Rows of cells as aligned plain text: columns two spaces apart, trailing spaces cut.

    Args:
        rows: the rows; each cell is printed with ``str``. A row may have fewer cells.
        header: column titles, printed first (with a dashed rule under them if ``rule``).
        align: one letter per column, ``"l"`` (the default for a missing letter) or ``"r"``.
        rule: put a line of dashes under the header.
        indent: put in front of every line.
        min_widths: at least this width per column (a status column as wide as its longest
            word, say, so tables of different loads line up).

    Returns:
        The lines joined by newlines (no newline at the end).

    >>> print(table([("embed", 4096), ("lm_head", 128)], header=("name", "bytes"), align="lr"))
    name     bytes
    embed     4096
    lm_head    128
    """
    cells = [[str(c) for c in row] for row in rows]
    if header is not None:
        cells.insert(0, list(header))
    ncols = max((len(r) for r in cells), default=0)
    widths = [max((len(r[i]) for r in cells if i < len(r)), default=0) for i in range(ncols)]
    widths = [max(w, m) for w, m in zip(widths, [*min_widths, *[0] * ncols], strict=False)]

    def line(row: Sequence[str]) -> str:
        padded = [
            c.rjust(w) if align[i : i + 1] == "r" else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=False))
        ]
        return (indent + "  ".join(padded)).rstrip()

    lines = [line(r) for r in cells]
    if header is not None and rule:
        lines.insert(1, indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# The width text for people is held to: tables, reports, notebook outputs.
WIDTH = 100

# Tree drawing characters: a wrapped tree line continues under its branch, not under the fork.
_TREE = str.maketrans({"├": "│", "└": " ", "─": " "})
_LEAD = " │├└─"


def wrap(text: str, width: int = WIDTH, *, hang: int | None = None) -> str:
    """Fold every line longer than ``width`` at spaces, keeping each word whole.

    A continuation line goes two columns right of the line's second word (``key: value...``
    continues under ``value``, a little in), so it is never mistaken for a child line at the
    line's own indent plus a step; with ``hang``, or when that column is past half the width,
    it goes ``hang`` (default 4) columns right of the line's indent. A tree line's ``├──``
    continues as ``│``. Words longer than the width (a long key, a rule of dashes) are never
    split, so a name stays whole and copyable, and such a line can stay wider than ``width``.
    A count stays with the word after it (``9 missing``, never ``9`` at a line's end), a
    number after a word with that word (``rank 3``).

    >>> print(wrap("key: " + "word " * 5, width=16))
    key: word word
           word word
           word
    >>> print(wrap("├── a b c d", width=8, hang=2))
    ├── a b
    │     c
    │     d
    >>> print(wrap("lost: a; 9 missing: b", width=12))
    lost: a;
          9 missing:
          b
    """
    out = []
    for line in text.expandtabs().split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = len(line) - len(line.lstrip(_LEAD))
        column = lead + (4 if hang is None else hang)
        if hang is None:
            second = _second_word(line, lead)
            if second is not None and second + 2 <= width // 2:
                column = second + 2
        indent = line[:lead].translate(_TREE) + " " * (column - lead)
        out += _fold(line, width, line[:lead], indent) or [line.rstrip()]  # blank: kept
    return "\n".join(out)


def _second_word(line: str, lead: int) -> int | None:
    gap = line.find(" ", lead)
    if gap < 0:
        return None
    start = len(line) - len(line[gap:].lstrip(" "))
    return start if start < len(line) else None


# A number standing alone and the space after it: a count and its noun fold as one word
# ("; 1 mismatched"); after a word it numbers that word instead ("rank 3"), and stays with it.
_COUNT = re.compile(r"(?<![A-Za-z] )(?<![^\s(\[])(\d+) (?=\S)")
_NUMBERED = re.compile(r"(?<=[A-Za-z]) (\d+)(?![^\s,;:)\]])")
_GLUE = "\x00"  # holds a count to its noun while folding (printed text never holds it)


def _fold(line: str, width: int, first: str, indent: str) -> list[str]:
    import textwrap  # here: the header-only inspector imports this module and rarely folds

    glue = _GLUE not in line
    body = line[len(first) :]
    if glue:
        body = _NUMBERED.sub(_GLUE + r"\1", _COUNT.sub(r"\1" + _GLUE, body))
    folded = textwrap.wrap(
        body,
        width=width,
        initial_indent=first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [part.replace(_GLUE, " ") for part in folded] if glue else folded
