"""Every code block in README.md and docs/*.md runs as written from the repository root and prints
what the page shows (issue 39). ``tests/doc_blocks.py`` says how a block's kind is read.

- A python block runs as a script (``python block.py``: a block that starts processes needs its
  main guard, as the page says) in a fresh interpreter, in a folder that is the repository root
  to it (each top-level entry linked, so what a block writes stays out of the tree); its
  output must be the bare block after it (``...`` stands for any text, as in doctest), or
  nothing when the page shows nothing. Blocks of a page run in page order, in one folder: a
  block may use a file an earlier one wrote, never a name it defined. A block importing a module
  of an extra that is not installed is skipped, naming the extra; so is one that stops on
  loadkit's own line naming the ``torch`` extra where torch is not installed.
- A console block's commands run in that folder too, with this checkout's ``loadkit`` command; each
  must print what the page shows under it (stdout and stderr together, as a terminal shows them).
- A bash block is checked, not run: ``loadkit inspect`` lines parse with the command's own parser
  (and run when their checkpoint exists in the repository: a verdict, exit 0 or 1), ``loadkit
  rename`` lines parse; a usage synopsis names only real flags (of either command); ``make``
  names real targets; scripts, modules and test paths exist; ``pip install`` names real extras.
"""

from __future__ import annotations

import doctest
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
from doc_blocks import EXTRA_OF, PAGES, Block, all_blocks, blocks, commands, imported_modules
from doc_blocks import session as console_session
from repo_paths import REPO

from loadkit.errors import TORCH_HINT

TIMEOUT = 600
CHECKER = doctest.OutputChecker()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)  # this checkout's code, also for the `loadkit` script
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.pop("COLUMNS", None)
    env["LOADKIT_PROGRESS_DELAY"] = "1000"  # no progress bar in what the page shows
    return env


def _same(shown: str, printed: str) -> bool:
    def tidy(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip("\n").split("\n")) + "\n"

    if not shown.strip():
        return not printed.strip()
    return CHECKER.check_output(tidy(shown), tidy(printed), doctest.ELLIPSIS)


def _missing_extra(block: Block) -> str | None:
    if block.lang != "python":
        return None
    for module in sorted(imported_modules(block.text)):
        extra = EXTRA_OF.get(module)
        if extra is not None and importlib.util.find_spec(module.split(".")[0]) is None:
            return f"needs the '{extra}' extra: {module} is not installed"
    return None


class PageRun:
    """A page's python and console blocks, run in page order in one working folder."""

    def __init__(self, page: Path, folder: Path) -> None:
        self.folder = folder
        for entry in REPO.iterdir():
            if entry.name not in {".git", ".venv"}:
                (folder / entry.name).symlink_to(entry)
        self.todo = [b for b in blocks(page) if b.lang in ("python", "console")]
        self.done: dict[int, list[tuple[str, str, str]]] = {}

    def result(self, block: Block) -> list[tuple[str, str, str]]:
        """(what ran, what the page shows, what it printed) for each step of ``block``."""
        for earlier in self.todo:
            if earlier.line not in self.done:
                self.done[earlier.line] = self._run(earlier)
            if earlier.line == block.line:
                break
        return self.done[block.line]

    def _run(self, block: Block) -> list[tuple[str, str, str]]:
        if _missing_extra(block) is not None:
            return []
        if block.lang == "python":
            script = self.folder / f"block_{block.page.stem}_{block.line}.py"
            script.write_text(block.text)
            out = self._call([sys.executable, script.name])
            return [("the block", block.shows or "", out)]
        steps = console_session(block.text)
        return [(cmd, shown, self._call(["bash", "-c", cmd])) for cmd, shown in steps]

    def _call(self, argv: list[str]) -> str:
        done = subprocess.run(
            argv,
            cwd=self.folder,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        if argv[0] == sys.executable:
            if done.returncode != 0:
                return f"exit {done.returncode}\n{done.stdout}{done.stderr}"
            return done.stdout
        return done.stdout + done.stderr  # a console command: exit status shown by its output


@pytest.fixture(scope="module")
def page_runs(tmp_path_factory):
    runs: dict[Path, PageRun] = {}

    def run(page: Path) -> PageRun:
        if page not in runs:
            runs[page] = PageRun(page, tmp_path_factory.mktemp(page.stem))
        return runs[page]

    return run


RUNNABLE = all_blocks(("python", "console"))


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_block_prints_what_the_page_shows(block, page_runs):
    reason = _missing_extra(block)
    if reason is not None:
        pytest.skip(f"{block.id}: {reason}")
    for what, shown, printed in page_runs(block.page).result(block):
        if TORCH_HINT in printed and importlib.util.find_spec("torch") is None:
            pytest.skip(f"{block.id}: needs the 'torch' extra: torch is not installed")
        assert _same(shown, printed), (
            f"{block.id}: {what} printed\n{printed}\nwhile the page shows\n{shown}"
        )


def test_every_page_has_its_blocks_read():
    assert len(RUNNABLE) >= 10
    assert {b.page.name for b in RUNNABLE} >= {"README.md", "api.md", "inspect.md"}


# --- bash blocks: checked, not run ---------------------------------------------------------------


@cache
def _parser_flags() -> set[str]:
    from loadkit_inspect.cli.arguments import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    return {
        flag
        for command in commands.values()  # inspect's and rename's
        for action in command._actions
        for flag in action.option_strings
    }


@cache
def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([\w-]+):", text, flags=re.M))


@cache
def _extras() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return set(project.get("optional-dependencies", {}))


def _check_inspect(args: list[str]) -> str | None:
    from loadkit_inspect.cli.arguments import parse_inspect

    try:
        parsed = parse_inspect(args)
    except SystemExit:
        return f"loadkit inspect {shlex.join(args)}: a usage error"
    if not (REPO / parsed.checkpoint).exists():
        return None  # a placeholder: parsing is all that can be checked
    done = subprocess.run(
        ["loadkit", "inspect", *args],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    if done.returncode not in (0, 1):
        return f"loadkit inspect {shlex.join(args)}: exit {done.returncode}: {done.stderr}"
    return None


def _check_rename(args: list[str]) -> str | None:
    """A ``loadkit rename`` line parses (it writes: the console blocks run it for real)."""
    from loadkit_inspect.cli.arguments import parse_command

    try:
        parse_command(["rename", *args])
    except SystemExit:
        return f"loadkit rename {shlex.join(args)}: a usage error"
    return None


def _check_python(args: list[str]) -> str | None:
    if args[:2] == ["-m", "pytest"]:
        return _check_paths(args[2:])
    if args[0] == "-m":
        found = importlib.util.find_spec(args[1]) is not None
        return None if found else f"python -m {args[1]}: no such module"
    return None if (REPO / args[0]).is_file() else f"python {args[0]}: no such file"


def _check_paths(args: list[str]) -> str | None:
    for arg in args:
        value = arg.split("=", 1)[-1].split("::")[0]
        if "/" in value and not (REPO / value).exists():
            return f"{value}: no such file or folder"
    return None


def _check_make(args: list[str]) -> str | None:
    for arg in args:
        _, _, value = arg.partition("=")
        if value and value.endswith(".ipynb") and not (REPO / "notebooks" / value).exists():
            return f"make {arg}: no such notebook"
        if not value and arg not in _make_targets():
            return f"make {arg}: no such target"
    return None


def _check_pip(args: list[str]) -> str | None:
    for arg in args:
        m = re.fullmatch(r"(?:\.|loadkit)\[([\w,]+)\]", arg)
        if m is not None:
            unknown = set(m.group(1).split(",")) - _extras()
            if unknown:
                return f"pip install {arg}: no extra {sorted(unknown)}"
    return None


def check_command(line: str) -> str | None:
    """None when ``line`` (one command of a bash block) holds up, else what is wrong."""
    if "[--" in line:  # a usage synopsis: every flag it names is real
        unknown = sorted(set(re.findall(r"--[\w-]+", line)) - _parser_flags())
        return f"the synopsis names unknown flags {unknown}" if unknown else None
    words = shlex.split(line, comments=True)
    if words[:2] == ["loadkit", "inspect"]:
        return _check_inspect(words[2:])
    if words[:2] == ["loadkit", "rename"]:
        return _check_rename(words[2:])
    if words[0] in ("python", ".venv/bin/python", "python3"):
        return _check_python(words[1:])
    if words[0] == "pytest":
        return _check_paths(words[1:])
    if words[0] == "make":
        return _check_make(words[1:])
    if words[:2] == ["pip", "install"]:
        return _check_pip(words[2:])
    return f"no check for {words[0]!r}: add one to tests/test_doc_examples.py"


@pytest.mark.parametrize("block", all_blocks(("bash", "sh")), ids=lambda b: b.id)
def test_bash_block_names_real_things(block):
    wrong = [w for line in commands(block.text) if (w := check_command(line)) is not None]
    assert wrong == [], f"{block.id}: {wrong}"


def test_the_checks_can_fail():
    assert check_command("loadkit inspect x --no-such-flag") is not None
    assert check_command("loadkit inspect X [--model SPEC] [--nope]") is not None
    assert check_command("make no-such-target") is not None
    assert check_command("make notebooks NB=99_none.ipynb") is not None
    assert check_command(".venv/bin/python benchmarks/none.py") is not None
    assert check_command("pytest tests/none_here") is not None
    assert check_command("pip install 'loadkit[nope]'") is not None
    assert check_command("rm -rf /") is not None
    assert check_command("loadkit inspect data/plamo2/untied.safetensors --model nope") is not None
    assert not _same("a\n...\nz\n", "a\nq\n") and _same("a\n...\nz\n", "a\nb\nc\nz\n")


def test_pages_are_the_readme_and_docs():
    assert PAGES[0].name == "README.md" and len(PAGES) >= 8
