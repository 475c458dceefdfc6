"""The fenced code blocks of the README and docs/*.md, read as a reader reads them.

A block's info string says what it is:

- ``python``: code to paste into a fresh interpreter at the repository root. A bare block right
  after it (only blank lines between) is what it prints.
- ``console``: a terminal session. Each ``$ `` line is a command, the lines under it (up to the
  next ``$ ``) what it prints.
- ``bash`` or ``sh``: commands a reader adapts (placeholders such as ``path/to/folder``, long
  runs, the set-up itself): checked, not run (``tests/test_doc_examples.py``).
- anything else, and a bare block not after a python one: output or data, not code.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import NamedTuple

from repo_paths import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)[^\n]*$")

# Modules that come with an extra, not with `pip install loadkit`: a block importing one is
# skipped where it is not installed, and says so.
EXTRA_OF = {
    "torch": "torch",
    "safetensors.torch": "torch",
    "transformers": "hf",
    "huggingface_hub": "hf",
    "plotly": "notebooks",
    "ipywidgets": "notebooks",
    "anywidget": "notebooks",
    "kaleido": "notebooks",
}


class Block(NamedTuple):
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    shows: str | None  # for a python block: the bare block after it, if any

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order, each python block with what it shows."""
    lines = page.read_text().split("\n")
    raw: list[tuple[int, str, str, int]] = []  # (line, lang, text, line after the closing fence)
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence = m.group(2)
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        raw.append((i + 1, m.group(3), "\n".join(lines[i + 1 : j]) + "\n", j + 1))
        i = j + 1
    found = []
    for k, (line, lang, text, after) in enumerate(raw):
        shows = None
        if lang == "python" and k + 1 < len(raw):
            nxt = raw[k + 1]
            gap = lines[after : nxt[0] - 1]
            if nxt[1] == "" and all(not g.strip() for g in gap):
                shows = nxt[2]
        found.append(Block(page, line, lang, text, shows))
    return found


def all_blocks(lang: str | tuple[str, ...]) -> list[Block]:
    langs = (lang,) if isinstance(lang, str) else lang
    return [b for page in PAGES for b in blocks(page) if b.lang in langs]


def imported_modules(code: str) -> set[str]:
    """The modules a python block imports (``a.b`` gives ``a`` and ``a.b``)."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            mods = [node.module]
        else:
            continue
        for mod in mods:
            parts = mod.split(".")
            names.update(".".join(parts[: n + 1]) for n in range(len(parts)))
    return names


def session(text: str) -> list[tuple[str, str]]:
    """A console block as (command, what it prints) pairs."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"console block starts with output, not a '$ ' command: {line!r}")
    return [(cmd, "\n".join(out) + "\n" if out else "") for cmd, out in steps]


def commands(text: str) -> list[str]:
    """A bash block's commands: continuation lines joined, blank lines left out."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.split("\n") if line.strip()]
