"""The user-facing documents hold together: README.md, CHANGELOG.md and docs/*.md.

- Every relative link points at something: a file or folder of the repository, and a ``#anchor``
  into a Markdown file names one of its headings, slugged as GitHub slugs them.
- Every repository path written in code (``tests/...py``, ``benchmarks/...``) exists, and every
  ``loadkit.x.y`` module named there is one (the changelog aside: it names what is gone).
- The README stays short; the reference lists every ``inspect`` flag and every pinned deviation.
- No module cites a document outside the repository (the team's contract, by section number):
  what users need to read is in docs/.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from repo_paths import REPO

DOCS = sorted((REPO / "docs").glob("*.md"))
DOCUMENTS = [REPO / "README.md", REPO / "CHANGELOG.md", *DOCS]
IDS = [str(p.relative_to(REPO)) for p in DOCUMENTS]

FENCE = re.compile(r"^(```|~~~)")
# [text](target) and ![alt](target), not inside code spans (removed first).
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lowercased, punctuation other than ``-`` and
    ``_`` removed, each space a ``-``.

    >>> github_slug("A Hugging Face checkpoint: `--model hf`")
    'a-hugging-face-checkpoint---model-hf'
    """
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LMN" or cat == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file; a repeated one gets ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(path.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    """The link targets outside code; a link's text may run over several lines."""
    prose = "\n".join(CODE_SPAN.sub("", line) for line in _prose_lines(path.read_text()))
    return LINK.findall(prose)


def broken_links(path: Path) -> list[str]:
    bad = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor in {dest.name}")
        elif anchor and dest.suffix != ".md":
            bad.append(f"{target}: an anchor into a file that is not Markdown")
    return bad


def test_the_slugs_follow_github():
    assert github_slug("Bug 4: tensor-parallel loading") == "bug-4-tensor-parallel-loading"
    assert github_slug("The `--json` document") == "the---json-document"
    assert github_slug('What "would load cleanly" means') == "what-would-load-cleanly-means"
    assert github_slug("Faithful to vLLM 0.28.0") == "faithful-to-vllm-0280"
    assert github_slug("Plamo2 moves to `AutoWeightsLoader`") == "plamo2-moves-to-autoweightsloader"


def test_the_link_check_sees_a_broken_link(tmp_path):
    doc = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Title\n\n## Two words\n\n## Two words\n")
    doc.write_text(
        "# A\n\n[ok](b.md#two-words-1) [gone](c.md) [bad anchor](b.md#three)"
        " [self](#a) [not self](#b)\n\n```\n[in code](nothing.md)\n```\n`[span](x.md)`\n"
        "![a picture whose alt text\nruns over two lines](img/none.png)\n"
    )
    assert broken_links(doc) == [
        "c.md: no such file",
        "b.md#three: no heading with that anchor in b.md",
        "#b: no heading with that anchor in a.md",
        "img/none.png: no such file",
    ]


@pytest.mark.parametrize("path", DOCUMENTS, ids=IDS)
def test_every_relative_link_points_at_something(path):
    assert path.exists()
    assert broken_links(path) == []


def test_the_documents_are_linked_from_the_readme():
    readme = {t.partition("#")[0] for t in links(REPO / "README.md")}
    assert sorted(p.name for p in DOCS if f"docs/{p.name}" not in readme) == []
    assert "CHANGELOG.md" in readme


# A path inside the repository, written in code: `tests/x.py`, `benchmarks/a.md`, `data/plamo2/`.
REPO_PATH = re.compile(r"^(?:\.\./)*((?:loadkit|tests|benchmarks|data|notebooks|docs)/[\w./-]*)$")
MODULE = re.compile(r"^loadkit(?:\.\w+)+$")


def _code_spans(path: Path) -> list[str]:
    spans = []
    for line in _prose_lines(path.read_text()):
        spans += [m.group(2).strip() for m in CODE_SPAN.finditer(line)]
    return spans


def _missing_module(name: str) -> str | None:
    """``None`` when ``name`` is a loadkit module, or a module and names it defines."""
    parts = name.split(".")
    here = REPO
    for i, part in enumerate(parts):
        if (here / part / "__init__.py").exists():
            here = here / part
            continue
        if (here / f"{part}.py").exists():
            return None  # a module; what follows are its attributes
        # Not a module: a name the package exports (its __init__ mentions it), else missing.
        init = (here / "__init__.py").read_text() if i else ""
        return None if re.search(rf"\b{re.escape(part)}\b", init) else name
    return None


# The changelog names what was renamed or removed: its old names are history, not references.
REFERENCES = [p for p in DOCUMENTS if p.name != "CHANGELOG.md"]


@pytest.mark.parametrize("path", REFERENCES, ids=[str(p.relative_to(REPO)) for p in REFERENCES])
def test_every_path_and_module_named_in_code_exists(path):
    missing = []
    for span in _code_spans(path):
        m = REPO_PATH.match(span)
        if m and not any(c in span for c in "*{<"):
            if not (REPO / m.group(1)).exists() and not m.group(1).startswith("data/big"):
                missing.append(span)
        elif MODULE.match(span):
            if _missing_module(span):
                missing.append(span)
    assert missing == []


def test_the_path_check_sees_a_missing_path(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("`tests/nothing_here.py` `loadkit.no_such_module` `loadkit.mapper.X` `tests/`\n")
    spans = _code_spans(doc)
    assert [s for s in spans if REPO_PATH.match(s) and not (REPO / s).exists()] == [
        "tests/nothing_here.py"
    ]
    assert [s for s in spans if MODULE.match(s) and _missing_module(s)] == [
        "loadkit.no_such_module"
    ]


def test_the_readme_is_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: the reference goes in docs/"


def test_the_changelog_keeps_an_unreleased_section():
    text = (REPO / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog")
    assert "## [Unreleased]" in text
    assert "keepachangelog.com" in text


def test_docs_inspect_lists_every_flag_of_the_command():
    out = subprocess.run(
        [sys.executable, "-m", "loadkit_inspect", "inspect", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", out.stdout))
    assert len(flags) > 10  # the help was read
    documented = set(re.findall(r"`(--[a-z][a-z-]*)", (REPO / "docs" / "inspect.md").read_text()))
    assert sorted(flags - documented) == [], "flags of `inspect --help` that docs/inspect.md lacks"


def test_docs_fidelity_names_every_deviation_test_and_only_those():
    source = (REPO / "tests" / "upstream" / "test_deviations.py").read_text()
    tests = {
        node.name
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }
    table = (REPO / "docs" / "fidelity.md").read_text()
    named = set(re.findall(r"`(test_\w+)`", table))
    assert len(tests) > 10
    assert sorted(tests - named) == [], "deviation tests docs/fidelity.md does not list"
    assert sorted(named - tests - {"test_deviations"}) == [], "listed tests that do not exist"


SPEC_CITATION = re.compile(r"\bSPEC(?:'s)?\s*(?:section\s*)?\d+")


def _spec_citations(root: Path) -> list[str]:
    hits = []
    for path in sorted(root.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if SPEC_CITATION.search(line):
                hits.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return hits


@pytest.mark.parametrize("folder", ["loadkit", "tests", "benchmarks", "data"])
def test_no_module_cites_a_document_outside_the_repository(folder):
    assert _spec_citations(REPO / folder) == []


def test_the_citation_check_sees_one(tmp_path):
    spec = "SP" + "EC"  # spelled apart, so that this file passes its own check
    lines = [f'"""The probe ({spec} 4)."""', f"# {spec}'s 7, to the letter"]
    (tmp_path / "m.py").write_text("\n".join(lines) + "\n")
    (tmp_path / "n.py").write_text('"""--model SPEC: a model spec, not a citation."""\n')
    assert _spec_citations(tmp_path) == [
        f'm.py:1: """The probe ({spec} 4)."""',
        f"m.py:2: # {spec}'s 7, to the letter",
    ]


def _json_schema_rows() -> dict[str, str]:
    """The ``--json`` table of docs/inspect.md: each key of its first column -> its row."""
    text = (REPO / "docs" / "inspect.md").read_text()
    section = text.split("## The `--json` document", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) > 3 and "`" in cells[1]:
            for key in re.findall(r"`(\w+)`", cells[1]):
                rows[key] = line
    return rows


@pytest.mark.slow
def test_docs_inspect_documents_every_key_of_the_json_document():
    from loadkit_inspect import inspect_checkpoint
    from loadkit_inspect.inspect_report import SCHEMA_VERSION

    report = inspect_checkpoint(
        REPO / "data" / "llama_like" / "model.safetensors", model="llama-like", tp=2, probe=True
    )
    doc = json.loads(report.to_json())
    rows = _json_schema_rows()
    text = (REPO / "docs" / "inspect.md").read_text()
    assert f'"schema": {SCHEMA_VERSION}' in text and doc["schema"] == SCHEMA_VERSION
    assert sorted(set(doc) - set(rows) - {"schema"}) == [], "top-level keys without a row"
    undocumented = sorted(
        f"{key}.{sub}"
        for key, value in doc.items()
        if isinstance(value, dict)
        for sub in value
        if f"`{sub}`" not in rows[key]
    )
    assert undocumented == [], "keys the docs/inspect.md --json table does not name"


def test_every_test_the_documents_name_exists():
    defined = set()
    for path in (REPO / "tests").rglob("*.py"):
        defined |= set(re.findall(r"^\s*def (test_\w+)", path.read_text(), re.M))
        defined.add(path.stem)  # a test module named by its name
    named = {
        span for path in REFERENCES for span in _code_spans(path) if re.fullmatch(r"test_\w+", span)
    }
    assert len(named) > 10
    assert sorted(named - defined) == []


@pytest.mark.parametrize("name", ["README.md", "docs/inspect.md"])
def test_the_built_in_models_are_listed_as_the_registry_has_them(name):
    from loadkit_inspect.models.registry import BUILTIN

    text = " ".join((REPO / name).read_text().split())
    listing = re.search(r"`gemma4-like`(?:,? (?:and )?`[\w-]+`)*", text)
    assert listing is not None
    assert re.findall(r"`([\w-]+)`", listing.group(0)) == list(BUILTIN)


@pytest.mark.slow
def test_the_readme_example_is_what_inspect_prints(tmp_path, loadkit_cli):
    """The README's broken export, made and inspected: the lines it shows are the command's."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(REPO / "data" / "plamo2" / "untied.safetensors")
    tensors["model.final_norm.weight"] = tensors.pop("model.norm.weight")
    save_file(tensors, tmp_path / "broken.safetensors")
    readme = (REPO / "README.md").read_text()
    command = "$ loadkit inspect broken.safetensors --model plamo2\n...\n"
    shown = readme.split(command, 1)[1].split("```", 1)[0].splitlines()
    assert len(shown) > 10
    out = loadkit_cli("inspect", "broken.safetensors", "--model", "plamo2", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    printed = out.stdout.splitlines()
    assert printed[-len(shown) :] == shown
