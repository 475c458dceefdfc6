"""The package's rules, checked on its source: what imports what.

- The header-only path (``import loadkit``, the inspection package except ``simulate`` and
  ``tensor_parallel``, the checkpoint reader, the mapper, the probe's decision) never imports
  torch.
- Imports run only down an explicit order of layers (``LAYERS``): a module imports its own
  package and the layers below, never a peer package of its layer nor anything above.
- No import cycle among loadkit modules, counting every import: module level, inside functions
  and under ``TYPE_CHECKING`` (a cycle that only type checkers see is still two modules that
  cannot be read apart). One named exception: an observer interface's annotations name what it
  observes (``loadkit.loading.observe`` names the ledger and the loader that call it).
- The library never imports the notebook layer (``loadkit_notebooks``).
- The notebook layer only draws: it calls none of the functions a notebook investigates (loads,
  reloads, the probe, inspect, the counters); the notebook's own cells call them.
- ``loadkit/`` itself holds a handful of modules; everything else lives in subpackages.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "loadkit"
# The three parts: the library, the inspect tool on top of it, the notebook layer on top of both.
PARTS = ("loadkit", "loadkit_inspect", "loadkit_notebooks")
DATA = ROOT / "data"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(p for part in PARTS for p in (ROOT / part).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path, *, type_checking: bool = True) -> set[str]:
    """The loadkit modules ``name`` imports anywhere in its source (``from a import b`` counts
    ``a``, and ``a.b`` when ``b`` is a module); without ``type_checking``, leaving out the
    imports under ``if TYPE_CHECKING:``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    if not type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test) in TYPE_CHECKING_TESTS:
                skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m in MODULES and m != name}


TYPE_CHECKING_TESTS = {"TYPE_CHECKING", "typing.TYPE_CHECKING"}
GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}
# Observer interfaces: their hooks' annotations name the objects that call them, so their
# TYPE_CHECKING imports point back at their callers by design. Only those imports are left out.
OBSERVER_INTERFACES = {"loadkit.loading.observe"}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_sees_real_edges():
    # The checks below are only as good as the graph: it must see the imports we know of.
    assert "loadkit_inspect.report.probe" in GRAPH["loadkit_inspect.inspect_report"]  # module level
    assert "loadkit_inspect.models.registry" in GRAPH["loadkit_inspect.inspector"]  # in a function
    assert "loadkit.pooling" in GRAPH["loadkit_inspect.report.probe"]  # under TYPE_CHECKING
    assert "loadkit.errors" in GRAPH["loadkit.terms"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    graph = dict(GRAPH)
    for name in OBSERVER_INTERFACES:
        graph[name] = _imports(name, MODULES[name], type_checking=False)
    assert _cycles(graph) == []


def test_the_observer_exception_is_narrow():
    # Its annotations do point at its callers (else the exception is stale), and nothing else
    # of the module is exempt: at run time it imports no loadkit module at all.
    observe = "loadkit.loading.observe"
    assert {"loadkit.loading.ledger", "loadkit.loading.auto_loader"} <= GRAPH[observe]
    assert _imports(observe, MODULES[observe], type_checking=False) == set()


# The layers, bottom first. A module may import modules of its own package and of the layers
# below its own: never a peer package of its layer, never a layer above. The top layer is the
# faces (``loadkit``'s lazy names, ``loadkit``): nothing below imports them.
LAYERS: list[tuple[str, ...]] = [
    ("loadkit.errors", "loadkit.fmt"),
    ("loadkit.terms",),
    ("loadkit.mapper", "loadkit.checkpoint"),
    ("loadkit.loading",),
    ("loadkit.parallel", "loadkit.pooling", "loadkit.reload"),
    # The models are built from the layers; the runner runs whichever model its caller names.
    ("loadkit.models", "loadkit.executor"),
    # The library's face (``from loadkit import ...``), then the two parts built on the library.
    ("loadkit",),
    ("loadkit_inspect",),
    ("loadkit_notebooks",),
]


def _unit(module: str) -> tuple[int, str]:
    """``(layer index, package)`` of ``module``: the package of ``LAYERS`` that holds it."""
    for index, layer in enumerate(LAYERS):
        for package in layer:
            if module == package or (package != "loadkit" and module.startswith(package + ".")):
                return index, package
    raise LookupError(f"{module} is on no layer: add its package to LAYERS")


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for name, deps in sorted(graph.items()):
        layer, package = _unit(name)
        for dep in sorted(deps):
            dep_layer, dep_package = _unit(dep)
            if dep_package != package and dep_layer >= layer:
                where = "a peer on its layer" if dep_layer == layer else "a layer above"
                out.append(f"{name} imports {dep} ({where})")
    return out


def test_every_module_is_on_a_layer():
    placed = {m: _unit(m) for m in MODULES}  # raises for a module on no layer
    assert {package for _, package in placed.values()} == {p for layer in LAYERS for p in layer}


def test_the_layer_check_sees_what_runs_up_or_sideways():
    assert _layer_violations(
        {
            "loadkit.parallel.share": {"loadkit.models.llama", "loadkit.parallel.state"},
            "loadkit.models.registry": {"loadkit_inspect.simulate"},
            "loadkit.pooling.probe": {"loadkit.reload.layer", "loadkit.mapper"},
            "loadkit.loading.meta": {"loadkit"},
        }
    ) == [
        "loadkit.loading.meta imports loadkit (a layer above)",
        "loadkit.models.registry imports loadkit_inspect.simulate (a layer above)",
        "loadkit.parallel.share imports loadkit.models.llama (a layer above)",
        "loadkit.pooling.probe imports loadkit.reload.layer (a peer on its layer)",
    ]


def test_imports_run_only_down_the_layers():
    # Every import counts: module level, inside functions and under TYPE_CHECKING.
    assert _layer_violations(GRAPH) == []


# The tool's own layers, bottom first, by its top-level modules and subpackages (``__init__``: the
# package's face): a tool module imports its own unit and the layers below, never a peer of its
# layer nor a layer above. Each report section's record renders its own text, so ``report`` (the
# sections the others share) sits low and ``inspect_report`` (the whole, in order) high.
TOOL_LAYERS: list[tuple[str, ...]] = [
    ("options", "casts", "progress"),
    ("sources",),
    ("report",),
    ("patterns", "mapper_trace", "fixes", "models", "tensor_parallel"),
    ("simulate",),
    ("loaders",),
    ("inspect_report",),
    ("inspector",),
    ("rename",),
    ("cli",),
    ("__init__", "__main__"),
]


def _tool_unit(module: str) -> tuple[int, str]:
    """``(layer index, unit)`` of a tool module on ``TOOL_LAYERS``."""
    parts = module.split(".")
    unit = parts[1] if len(parts) > 1 else "__init__"
    for index, layer in enumerate(TOOL_LAYERS):
        if unit in layer:
            return index, unit
    raise LookupError(f"{module} is on no layer of the tool: add its unit to TOOL_LAYERS")


def _tool_layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for name, deps in sorted(graph.items()):
        if name.split(".")[0] != "loadkit_inspect":
            continue
        layer, unit = _tool_unit(name)
        for dep in sorted(d for d in deps if d.split(".")[0] == "loadkit_inspect"):
            dep_layer, dep_unit = _tool_unit(dep)
            if dep_unit != unit and dep_layer >= layer:
                where = "a peer on its layer" if dep_layer == layer else "a layer above"
                out.append(f"{name} imports {dep} ({where})")
    return out


def test_every_tool_module_is_on_a_tool_layer():
    units = {_tool_unit(m)[1] for m in MODULES if m.split(".")[0] == "loadkit_inspect"}
    assert units == {u for layer in TOOL_LAYERS for u in layer}


def test_the_tool_layer_check_sees_what_runs_up_or_sideways():
    assert _tool_layer_violations(
        {
            "loadkit_inspect.report.summary": {"loadkit_inspect.fixes.fix", "loadkit.errors"},
            "loadkit_inspect.fixes.fix": {"loadkit_inspect.models.hf", "loadkit_inspect.report"},
            "loadkit_inspect.inspector": {"loadkit_inspect.cli.main"},
        }
    ) == [
        "loadkit_inspect.fixes.fix imports loadkit_inspect.models.hf (a peer on its layer)",
        "loadkit_inspect.inspector imports loadkit_inspect.cli.main (a layer above)",
        "loadkit_inspect.report.summary imports loadkit_inspect.fixes.fix (a layer above)",
    ]


def test_the_tools_imports_run_only_down_its_layers():
    assert _tool_layer_violations(GRAPH) == []


def _names_imported(importer: str, parts: tuple[str, ...]) -> dict[tuple[str, str], list[str]]:
    """Every name of ``parts`` a module of the part ``importer`` imports, anywhere in its source:
    ``(module, name)`` (an ``import loadkit.x`` is ``("loadkit.x", "")``) -> the modules importing
    it."""
    found: dict[tuple[str, str], list[str]] = {}
    for name, path in MODULES.items():
        if name.split(".")[0] != importer:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if node.module.split(".")[0] in parts:
                    for alias in node.names:
                        found.setdefault((node.module, alias.name), []).append(name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in parts:
                        found.setdefault((alias.name, ""), []).append(name)
    return found


def _faces(part: str) -> list[str]:
    """A part's faces: its packages (their ``__init__``) and the modules at its top; a face's
    public names are its ``__all__`` (``__main__`` is a command, no face)."""
    return sorted(
        m
        for m, path in MODULES.items()
        if m.split(".")[0] == part
        and (path.name == "__init__.py" or m.count(".") == 1)
        and path.name != "__main__.py"
    )


PUBLIC_FACES = {part: _faces(part) for part in ("loadkit", "loadkit_inspect")}


def _not_public(imported: dict[tuple[str, str], list[str]]) -> list[str]:
    """The imported names that are not in their face's ``__all__`` (or come from no face)."""
    faces = {face for part in PUBLIC_FACES.values() for face in part}
    return [
        f"{module}:{name or '(the module)'} in {', '.join(sorted(set(users)))}"
        for (module, name), users in sorted(imported.items())
        if module not in faces
        or name not in getattr(importlib.import_module(module), "__all__", ())
    ]


@pytest.mark.parametrize("part", ["loadkit", "loadkit_inspect"])
def test_every_public_name_exists(part):
    for face in PUBLIC_FACES[part]:
        module = importlib.import_module(face)
        names = getattr(module, "__all__", [])
        assert [n for n in names if not hasattr(module, n)] == [], face


def test_the_tool_imports_only_the_librarys_public_names():
    imported = _names_imported("loadkit_inspect", ("loadkit",))
    assert ("loadkit.checkpoint", "IndexProblem") in imported  # the walk sees them
    assert _not_public(imported) == []
    faces = {module for module, _ in imported}
    print(f"the tool imports {len(imported)} library names from {len(faces)} modules")


def test_the_notebook_layer_imports_only_public_names():
    # The library's and the tool's: what a face's __all__ holds, as the tool takes the library's.
    imported = _names_imported("loadkit_notebooks", ("loadkit", "loadkit_inspect"))
    assert ("loadkit.reload", "ReloadStep") in imported  # the walk sees them
    assert ("loadkit_inspect", "InspectReport") in imported
    assert _not_public(imported) == []
    faces = {module for module, _ in imported}
    print(f"the notebook layer imports {len(imported)} names from {len(faces)} modules")


def test_the_public_name_check_sees_an_internal_name():
    assert _not_public({("loadkit.loading.ledger", "ledger_of"): ["x"]}) == [
        "loadkit.loading.ledger:ledger_of in x"
    ]
    assert _not_public({("loadkit.loading", "ledger_of"): ["x"]}) == []


# Each part's tests mirror it: ``tests/<folder>/<subpackage>/test_<module>[_aspect].py``.
TEST_FOLDERS = {
    "loadkit": ROOT / "tests" / "library",
    "loadkit_inspect": ROOT / "tests" / "tool",
    "loadkit_notebooks": ROOT / "tests" / "notebook_layer",
}
TOOL_TESTS = TEST_FOLDERS["loadkit_inspect"]
# Test files that test the tool whole (an install without torch or transformers), not one module.
WHOLE_TOOL_TESTS = {"test_torch_optional.py", "test_transformers_optional.py"}
# Tool modules with logic that have no test file named after them yet; the list may only shrink.
UNTESTED_TOOL_MODULES = {
    "loadkit_inspect.casts",
    "loadkit_inspect.cli.arguments",
    "loadkit_inspect.options",
    "loadkit_inspect.simulate.observer",
    "loadkit_inspect.simulate.outcome",
    "loadkit_inspect.simulate.recording",
    "loadkit_inspect.simulate.run",
    "loadkit_inspect.simulate.weights",
    "loadkit_inspect.tensor_parallel.rowmap",
    "loadkit_inspect.tensor_parallel.share",
}
# Library test files that test several modules together, named for what they test together.
LIBRARY_INTEGRATION_TESTS = {"test_direct_and_plan.py"}
# Library modules with logic that have no test file named after them yet; the list may only shrink.
UNTESTED_LIBRARY_MODULES = {
    "loadkit",
    "loadkit.errors",
    "loadkit.executor.results",
    "loadkit.executor.worker",
    "loadkit.loading.postload",
    "loadkit.loading.tensors",
    "loadkit.loading.track",
    "loadkit.models.llama.checkpoint",
    "loadkit.models.llama.config",
    "loadkit.models.llama.model",
    "loadkit.models.native.common",
    "loadkit.models.native.deepseek",
    "loadkit.models.native.gemma",
    "loadkit.models.native.gpt_oss",
    "loadkit.models.native.llama",
    "loadkit.models.native.mistral",
    "loadkit.models.native.moe",
    "loadkit.models.native.qwen2",
    "loadkit.models.native.qwen2_5_vl",
    "loadkit.models.nemotron_h.config",
    "loadkit.models.padded_moe.config",
    "loadkit.models.plamo2.skips",
    "loadkit.models.transformers.config",
    "loadkit.parallel.checks",
    "loadkit.parallel.holdings",
    "loadkit.parallel.param_loaders",
    "loadkit.parallel.quant",
    "loadkit.pooling",
    "loadkit.reload.bake",
    "loadkit.reload.layer",
    "loadkit.reload.lifecycle",
}
# The notebook layer's test files that test no module of it (nbval's ``notebooks/sanitize.cfg``).
NOTEBOOK_LAYER_OTHER_TESTS = {"test_sanitize.py"}
# Notebook-layer modules with logic and no test file named after them yet; may only shrink.
UNTESTED_NOTEBOOK_MODULES = {
    "loadkit_notebooks.chart",
    "loadkit_notebooks.fates",
}
NOT_NAMED_AFTER_A_MODULE = {
    "loadkit": LIBRARY_INTEGRATION_TESTS,
    "loadkit_inspect": WHOLE_TOOL_TESTS,
    "loadkit_notebooks": NOTEBOOK_LAYER_OTHER_TESTS,
}
UNTESTED_MODULES = {
    "loadkit": UNTESTED_LIBRARY_MODULES,
    "loadkit_inspect": UNTESTED_TOOL_MODULES,
    "loadkit_notebooks": UNTESTED_NOTEBOOK_MODULES,
}


def _tested_module(test: Path, part: str = "loadkit_inspect") -> str | None:
    """The module of ``part`` a test file is named after: ``tests/tool/A/test_B[_aspect].py``
    tests ``loadkit_inspect.A.B`` (or ``A._B``, a private module; ``test_A[_aspect].py`` in
    ``tests/tool/A``: the package ``A``), and likewise under the library's and the notebook
    layer's folders."""
    *folders, stem = test.relative_to(TEST_FOLDERS[part]).with_suffix("").parts
    words = stem.removeprefix("test_").split("_")
    for n in range(len(words), 0, -1):
        name = "_".join(words[:n])
        for module in (".".join([part, *folders, m]) for m in (name, f"_{name}")):
            if module in MODULES:
                return module
        if folders and name == folders[-1]:
            return ".".join([part, *folders])
    return None


def _has_logic(module: str) -> bool:
    tree = ast.parse(MODULES[module].read_text())
    return any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in tree.body)


def test_the_naming_rule_reads_test_paths():
    library = TEST_FOLDERS["loadkit"]
    assert _tested_module(library / "loading" / "test_auto_loader.py", "loadkit") == (
        "loadkit.loading.auto_loader"
    )
    assert _tested_module(library / "checkpoint" / "test_reader_fuzz.py", "loadkit") == (
        "loadkit.checkpoint.reader"
    )
    assert _tested_module(library / "models" / "test_common.py", "loadkit") == (
        "loadkit.models._common"
    )
    assert _tested_module(library / "loading" / "test_nothing.py", "loadkit") is None


@pytest.mark.parametrize("part", PARTS)
def test_every_test_file_is_named_after_a_module_of_its_part(part):
    tests = sorted(TEST_FOLDERS[part].rglob("test_*.py"))
    assert len(tests) > 10  # the folder was found
    others = NOT_NAMED_AFTER_A_MODULE[part]
    unnamed = [
        str(t.relative_to(ROOT))
        for t in tests
        if t.name not in others and not _tested_module(t, part)
    ]
    assert unnamed == []
    assert sorted(others - {t.name for t in tests}) == []  # gone or renamed: off the list


@pytest.mark.parametrize("part", PARTS)
def test_every_module_with_logic_has_a_test_file_named_after_it(part):
    tested = {_tested_module(t, part) for t in TEST_FOLDERS[part].rglob("test_*.py")}
    with_logic = {m for m in MODULES if m.split(".")[0] == part and _has_logic(m)}
    untested = UNTESTED_MODULES[part]
    assert sorted(with_logic - tested - untested) == []
    assert sorted(untested & tested) == []  # tested now: off the list
    assert sorted(untested - with_logic) == []  # gone: off the list
    print(f"{part}: {len(with_logic)} modules with logic, {len(untested)} without a test file")


def test_nothing_below_imports_the_notebook_layer():
    offenders = {
        name: sorted(
            m for m in deps if m == "loadkit_notebooks" or m.startswith("loadkit_notebooks.")
        )
        for name, deps in GRAPH.items()
        if not (name == "loadkit_notebooks" or name.startswith("loadkit_notebooks."))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


# What a notebook investigates: the notebook's cells call these, where the reader sees them;
# loadkit_notebooks draws the results (or re-runs a function the notebook hands it) and calls none.
INVESTIGATED = {
    "as_pooling_model",
    "load_weights",
    "AutoWeightsLoader",
    "make_checkpoint",
    "predict_probe",
    "CloneCounter",
    "CopyCounter",
    "get_numel_loaded",
    "record_metadata_for_reloading",
    "initialize_layerwise_reload",
    "finalize_layerwise_reload",
    "reload_log",
    "inspect_checkpoint",
    "run_tensor_parallel",
}


def _investigated_calls(source: str) -> list[str]:
    """Calls in ``source`` of a name in INVESTIGATED (``f(...)`` or ``x.f(...)``), in order."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            if name in INVESTIGATED:
                found.append(f"line {node.lineno}: {name}")
    return found


def _demo_modules() -> dict[str, Path]:
    return {
        n: p
        for n, p in MODULES.items()
        if n == "loadkit_notebooks" or n.startswith("loadkit_notebooks.")
    }


def test_the_call_check_sees_calls():
    src = "with CloneCounter() as c:\n    m.load_weights(w)\nprint('load_weights')\n"
    assert _investigated_calls(src) == ["line 1: CloneCounter", "line 2: load_weights"]


def test_the_demo_calls_nothing_a_notebook_investigates():
    offenders = {
        name: calls
        for name, path in _demo_modules().items()
        if (calls := _investigated_calls(path.read_text()))
    }
    assert offenders == {}


def test_the_notebook_layer_has_one_explorer():
    # The stories' widgets are parts of one class (loadkit_notebooks.viz.Explorer), not one each.
    defined = sorted(
        name
        for name, path in MODULES.items()
        if name.startswith("loadkit_notebooks")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "Explorer"
    )
    assert defined == ["loadkit_notebooks.viz"]


def test_every_exception_class_lives_in_errors():
    # errors.py says it holds every error; a class deriving from an exception or warning class
    # anywhere else breaks that (bases checked by name: *Error, *Exception, *Warning).
    def is_exception(base: ast.expr) -> bool:
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
        return name.endswith(("Error", "Exception", "Warning"))

    elsewhere = sorted(
        f"{name}.{node.name}"
        for name, path in MODULES.items()
        if name != "loadkit.errors"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and any(is_exception(b) for b in node.bases)
    )
    assert elsewhere == []
    errors = ast.parse(MODULES["loadkit.errors"].read_text())
    assert sum(isinstance(n, ast.ClassDef) for n in errors.body) > 20  # the check sees classes


def test_a_handful_of_top_level_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "errors.py", "fmt.py", "mapper.py", "terms.py"]
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    for required in ("checkpoint", "loading", "models", "parallel", "pooling", "reload"):
        assert required in packages


def test_the_three_parts_stand_at_the_top_of_the_tree():
    # The library imports neither other part; the tool never imports the notebook layer.
    def part(module: str) -> str:
        return module.split(".")[0]

    upward = sorted(
        f"{name} imports {dep}"
        for name, deps in GRAPH.items()
        for dep in deps
        if PARTS.index(part(dep)) > PARTS.index(part(name))
    )
    assert upward == []
    assert {part(m) for m in MODULES} == set(PARTS)


# The parts of the inspection package that simulate on the meta device, imported only when asked.
TORCH_PARTS_OF_INSPECTION = ("loadkit_inspect.simulate", "loadkit_inspect.tensor_parallel")
TORCH_FREE = [
    "loadkit",
    "loadkit.errors",
    "loadkit.fmt",
    "loadkit.mapper",
    "loadkit.terms",
    "loadkit.checkpoint",
    "loadkit.checkpoint.dtypes",
    "loadkit.checkpoint.reader",
    "loadkit.checkpoint.merge",
    "loadkit.pooling",
    "loadkit.pooling.probe",
    *sorted(
        m
        for m in MODULES
        if m.startswith("loadkit_inspect")
        and not m.startswith(TORCH_PARTS_OF_INSPECTION)
        and m != "loadkit_inspect.__main__"
    ),
]


def test_the_header_only_path_never_imports_torch():
    """Every torch-free module imported, then a whole header-only report built, rendered and
    serialised (with a mapper traced over the names), in a fresh process."""
    code = f"""
import importlib, json, sys
for name in {TORCH_FREE!r}:
    importlib.import_module(name)
from loadkit import LoadkitError, open_checkpoint
from loadkit_inspect import inspect_checkpoint
from loadkit_inspect.cli.main import main
report = inspect_checkpoint({str(DATA / "plamo2" / "tied-with-lm-head")!r},
                            mapper={{"orig_to_new_prefix": {{"model.": ""}}}})
text, doc = report.render(), report.to_json()
assert main(["inspect", {str(DATA / "gemma4_like" / "model.safetensors")!r}, "--json"]) == 0
print(json.dumps({{"torch": "torch" in sys.modules, "lines": len(text.splitlines()),
                  "mapper": report.mapper is not None}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert last == {"torch": False, "lines": last["lines"], "mapper": True} and last["lines"] > 5


@pytest.mark.parametrize("part", TORCH_PARTS_OF_INSPECTION)
def test_the_inspection_parts_that_need_torch_are_named(part):
    # The rule's exceptions, each named in the inspection package's docstring.
    modules = [m for m in MODULES if m == part or m.startswith(part + ".")]
    assert any("torch" in {n.split(".")[0] for n in _third_party(m)} for m in modules)
    doc = ast.get_docstring(ast.parse(MODULES["loadkit_inspect"].read_text())) or ""
    assert f"``{part.rpartition('.')[2]}``" in doc and "torch" in doc


def _third_party(name: str) -> set[str]:
    tree = ast.parse(MODULES[name].read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", ["loadkit.checkpoint.reader", "loadkit_inspect.report.layout"])
def test_torch_free_modules_do_not_even_mention_it_at_import(module):
    # Not just untouched at run time: no module-level torch import at all.
    tree = ast.parse(MODULES[module].read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in top if isinstance(n, ast.ImportFrom)}
    assert not {n for n in names if n == "torch" or n.startswith("torch.")}


def _module_map() -> list[str]:
    """Module names in the first column of the module map in docs/architecture.md."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    section = text.split("## The module map", 1)[1].split("\n## ", 1)[0]
    names = []
    for line in section.splitlines():
        if line.startswith("| `loadkit"):
            first = line.split("|")[1]
            names += [n.strip().strip("`") for n in first.split(",")]
    return names


def test_the_module_map_names_every_module_and_only_real_ones():
    named = _module_map()
    assert len(named) > 40  # the section was found
    listed = {n for n in named if not n.endswith(".*")}
    assert sorted(listed - set(MODULES)) == []  # each named module exists
    covered = {m for m in MODULES if m in listed}
    covered |= {m for m in MODULES for n in named if n.endswith(".*") and m.startswith(n[:-1])}
    packages_only = {m for m, p in MODULES.items() if p.name == "__init__.py"} - {"loadkit"}
    unlisted = set(MODULES) - covered - packages_only - {"loadkit_inspect.__main__"}
    assert sorted(unlisted) == []  # and every module is named


MAX_FUNCTION_LINES = 60  # from its def to its last line, its docstring left out
# Functions still over the limit, each to be split; the list may only shrink.
LONG_FUNCTIONS: set[str] = set()


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    lines = (node.end_lineno or node.lineno) - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):  # the docstring
            lines -= (first.end_lineno or first.lineno) - first.lineno + 1
    return lines


def _long_functions() -> dict[str, int]:
    return {
        f"{name}:{node.name}": lines
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (lines := _code_lines(node)) > MAX_FUNCTION_LINES
    }


def test_no_function_is_longer_than_sixty_lines():
    long = _long_functions()
    assert sorted(set(long) - LONG_FUNCTIONS) == []
    assert sorted(LONG_FUNCTIONS - set(long)) == []  # split: take it off the list


def test_the_inspector_reads_as_its_pipeline():
    # inspect_checkpoint() calls the steps in the order the module defines them, each once.
    tree = ast.parse(MODULES["loadkit_inspect.inspector"].read_text())
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    pipeline = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "inspect_checkpoint"
    )
    calls = [
        n
        for n in ast.walk(pipeline)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in functions
    ]
    called = [n.func.id for n in sorted(calls, key=lambda n: (n.lineno, n.col_offset))]
    steps = [
        f for f in functions[functions.index("inspect_checkpoint") + 1 :] if not f.startswith("_")
    ]
    assert called == steps, (called, steps)  # a private helper of a step is no step
    assert "read_checkpoint" in steps and "plan_tensor_parallel" in steps
