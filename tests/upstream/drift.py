"""Following a vLLM release: what moved in the code loadkit mirrors, and does loadkit still agree.

``make upstream-drift VLLM=X.Y.Z`` (or ``python tests/upstream/drift.py X.Y.Z [--since A.B.C]``):

1. fetches ``vllm==X.Y.Z`` with ``fetch.py`` (hash-checked by pip against the index; pinned when
   ``fetch.PINS`` has it, else its digest is printed to pin) and extracts the files the harness
   reads, as for the pinned versions;
2. lists every upstream function and method loadkit mirrors (``MIRRORED``) whose code changed
   since ``--since`` (default: the pinned reference, ``fetch.REFERENCE``), and those added or
   removed: the code compared as syntax trees, so formatting, comments and docstrings do not
   count (a docstring-only change is listed apart);
3. runs the differential suite against ``X.Y.Z`` (``LOADKIT_UPSTREAM_REFERENCE=X.Y.Z``, the
   version the ``up`` fixture loads) in census mode, so every property reports how many generated
   cases agree instead of stopping at the first difference, and prints the tally.

The exit status is the suite's: 0 when every property agrees (documented deviations aside).
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script: `upstream` is a package under tests/

from upstream import fetch  # noqa: E402

# What loadkit mirrors: upstream file -> the functions and methods (fnmatch patterns over
# qualified names, "Class.method", "outer.<locals>.inner") it re-implements or runs beside.
MIRRORED: dict[str, tuple[str, ...]] = {
    "vllm/model_executor/models/utils.py": (
        "WeightsMapper.*",
        "AutoWeightsLoader.*",
        "_get_tied_embedding_params",
    ),
    "vllm/model_executor/model_loader/weight_utils.py": (
        "default_weight_loader",
        "composed_weight_loader",
        "finalize_model_weights",
    ),
    "vllm/model_executor/utils.py": ("set_weight_attrs", "copy_weight_"),
    "vllm/model_executor/models/adapters.py": ("_create_pooling_model_cls*",),
    "vllm/model_executor/model_loader/reload/*.py": ("*",),
    "vllm/model_executor/models/transformers/base.py": (
        "Base._create_hf_to_vllm_mapper",
        "Base._weight_conversions",
        "Base._get_tie_word_embeddings",
        "Base._vocab_embeddings",
        "Base.init_parameters",
        "Base.load_weights",
        "Base.keep_in_fp32",
    ),
    "vllm/model_executor/models/transformers/causal.py": ("CausalMixin.*",),
    "vllm/model_executor/models/transformers/legacy.py": ("LegacyMixin.__init__",),
    "vllm/model_executor/models/transformers/pooling.py": ("*Mixin.__init__",),
    "vllm/model_executor/model_loader/default_loader.py": (
        "DefaultModelLoader.track_weights_loading",
    ),
    "vllm/model_executor/layers/linear.py": (
        "StackedColumnParallelLinear.*",
        "MergedColumnParallelLinear.weight_loader*",
        "MergedColumnParallelLinear.validate_shard_id",
        "QKVParallelLinear.weight_loader*",
        "QKVParallelLinear.validate_shard_id",
        "ColumnParallelLinear.weight_loader*",
        "RowParallelLinear.weight_loader*",
    ),
    "vllm/config/model.py": (
        "ModelConfig.verify_with_parallel_config",
        "ModelConfig._get_transformers_backend_cls",
    ),
}


@dataclass(frozen=True)
class Change:
    path: str
    name: str
    kind: str  # "changed", "docstring only", "added", "removed"


def _strip_docstring(node: ast.AST) -> ast.AST:
    body = getattr(node, "body", None)
    if (
        isinstance(body, list)
        and body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return node


def definitions(source: str) -> dict[str, tuple[str, str]]:
    """Every function and method of ``source`` by qualified name: (code, docstring), the code
    as its syntax tree (no positions, no docstrings), nested functions apart from their outer."""
    out: dict[str, tuple[str, str]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                doc = ast.get_docstring(child) or ""
                code = ast.dump(_strip_docstring(_copy(child)), include_attributes=False)
                out[name] = (code, doc)
                visit(child, f"{name}.<locals>.")

    visit(ast.parse(source), "")
    return out


def _copy(node: ast.AST) -> ast.AST:
    return ast.parse(ast.unparse(node)).body[0]


def _files(src: Path, pattern: str) -> list[str]:
    return sorted(str(p.relative_to(src)) for p in src.glob(pattern))


def changes(old_src: Path, new_src: Path) -> list[Change]:
    """The mirrored functions that differ between two extracted versions."""
    out: list[Change] = []
    for pattern, names in MIRRORED.items():
        paths = sorted(set(_files(old_src, pattern)) | set(_files(new_src, pattern)))
        for path in paths:
            old_f, new_f = old_src / path, new_src / path
            old = definitions(old_f.read_text()) if old_f.exists() else {}
            new = definitions(new_f.read_text()) if new_f.exists() else {}
            for name in sorted(set(old) | set(new)):
                if not any(fnmatch.fnmatchcase(name, n) for n in names):
                    continue
                if name not in new:
                    out.append(Change(path, name, "removed"))
                elif name not in old:
                    out.append(Change(path, name, "added"))
                elif old[name][0] != new[name][0]:
                    out.append(Change(path, name, "changed"))
                elif old[name][1] != new[name][1]:
                    out.append(Change(path, name, "docstring only"))
    return out


def report(found: list[Change], since: str, version: str) -> str:
    if not found:
        return f"vllm {since} -> {version}: no mirrored function changed"
    lines = [f"vllm {since} -> {version}: {len(found)} mirrored functions moved"]
    for kind in ("changed", "added", "removed", "docstring only"):
        of_kind = [c for c in found if c.kind == kind]
        if of_kind:
            lines.append(f"  {kind} ({len(of_kind)}):")
            lines += [f"    {c.path}: {c.name}" for c in of_kind]
    return "\n".join(lines)


def run_suite(version: str, examples: int) -> int:
    env = {
        **os.environ,
        "LOADKIT_UPSTREAM_REFERENCE": version,
        "LOADKIT_UPSTREAM_CENSUS": "1",
        "LOADKIT_UPSTREAM_EXAMPLES": str(examples),
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE)]
    return subprocess.run(cmd, env=env, cwd=HERE.parent.parent).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="the vLLM release to follow, e.g. 0.35.0")
    parser.add_argument(
        "--since", default=fetch.REFERENCE, help="compare with (default: %(default)s)"
    )
    parser.add_argument("--no-suite", action="store_true", help="list the changes only")
    parser.add_argument(
        "--examples", type=int, default=200, help="examples per property (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    try:
        new_src = fetch.ensure_sources(args.version)
        old_src = fetch.ensure_sources(args.since)
    except fetch.UpstreamFetchError as exc:
        print(f"drift: ERROR: {exc}", file=sys.stderr)
        return 1
    print(report(changes(old_src, new_src), args.since, args.version), flush=True)
    if args.no_suite:
        return 0
    return run_suite(args.version, args.examples)


if __name__ == "__main__":
    sys.exit(main())
