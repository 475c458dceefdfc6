"""vLLM's own loading code, one released version or several, executed unchanged next to loadkit.

A wheel cannot be imported (it needs CUDA and half of PyPI), so the harness builds just enough
of the ``vllm`` package for the definitions under test, from one version's extracted sources
(``tests/upstream/fetch.py``):

- the layerwise-reload package (``model_loader/reload/*.py``) is imported as it is, file by file;
- from the big modules (``models/utils.py``, ``models/adapters.py``,
  ``model_loader/weight_utils.py``, ``model_executor/utils.py``, ``layers/linear.py``) only the
  named top-level definitions are taken, with ``ast``, together with whatever they reference:
  other definitions of the same file and the file's own import statements for those names.
  The code objects are compiled from the upstream file (same file name and line numbers in
  tracebacks).

Each version lives in its own package, ``vllm_0_34_0``, ``vllm_0_28_0``, ..., so that several
load side by side in one process (``load_upstream("0.34.0", src)``): the one edit the harness
makes to upstream's code is the package name at the root of its absolute imports (``from
vllm.config import ...`` reads ``from vllm_0_34_0.config import ...``), in the definitions it
takes and in the files it imports, at module level and inside functions alike.

What the upstream definitions import from the rest of ``vllm`` is stubbed in ``sys.modules``, and
nothing else: a logger that records every call (tests read upstream's debug counters from it),
empty classes for type checks that must fail (``QuantizeMethodBase``, ``LogitsProcessor``, ...),
predicates answering ``False`` (no attention layers, no multimodal models, no integrated GPU),
and the environment settings the reload package reads, at their defaults.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dis
import importlib.abc
import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

UPSTREAM = "vllm"  # the package name upstream's own imports use


def root_of(version: str) -> str:
    """The package a version lives in here: ``vllm_0_34_0`` for ``0.34.0``."""
    return f"{UPSTREAM}_" + version.replace(".", "_")


# --- the stubs -----------------------------------------------------------------------------------


class LogRecorder:
    """Stands in for vLLM's logger: keeps every call as ``(level, message % args)``."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, str]] = []  # (logger name, level, message)

    def clear(self) -> None:
        self.records.clear()

    def named(self, name: str) -> _Logger:
        return _Logger(self, name)

    def messages(self, level: str | None = None) -> list[str]:
        return [m for _, lv, m in self.records if level is None or lv == level]


class _Logger:
    def __init__(self, recorder: LogRecorder, name: str) -> None:
        self._recorder = recorder
        self.name = name

    def _log(self, level: str, msg: object, *args: object, **_: object) -> None:
        text = str(msg) % args if args else str(msg)
        self._recorder.records.append((self.name, level, text))

    def debug(self, msg, *args, **kw):
        self._log("debug", msg, *args, **kw)

    def info(self, msg, *args, **kw):
        self._log("info", msg, *args, **kw)

    def warning(self, msg, *args, **kw):
        self._log("warning", msg, *args, **kw)

    def error(self, msg, *args, **kw):
        self._log("error", msg, *args, **kw)

    # vLLM's logger de-duplicates these per process; recording each call keeps examples
    # independent of the ones before them.
    def warning_once(self, msg, *args, **kw):
        self._log("warning_once", msg, *args, **kw)

    def info_once(self, msg, *args, **kw):
        self._log("info_once", msg, *args, **kw)

    def debug_once(self, msg, *args, **kw):
        self._log("debug_once", msg, *args, **kw)


def _module(name: str, *, package: bool = False, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    if package:
        mod.__path__ = []  # a namespace with nothing on disk: every child is registered by hand
    mod.__package__ = name if package else name.rpartition(".")[0]
    return mod


def _register(mod: types.ModuleType) -> types.ModuleType:
    sys.modules[mod.__name__] = mod
    parent, _, child = mod.__name__.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, mod)
    return mod


def _install_stubs(log: LogRecorder, root: str) -> None:
    class ModelConfig:  # only imported for annotations and signatures
        pass

    class VllmConfig:
        pass

    class QuantizeMethodBase:  # no layer in the tests is quantized: isinstance is False
        pass

    class LogitsProcessor(torch.nn.Module):  # the pooling adapter replaces these: none exist
        pass

    class VocabParallelEmbedding(torch.nn.Module):  # AutoWeightsLoader's tied-alias check
        pass

    class ParallelLMHead(VocabParallelEmbedding):
        pass

    class VllmModelForPooling:  # a mixin of the pooling class; its protocol adds no behaviour
        pass

    platform = types.SimpleNamespace(
        is_integrated_gpu=lambda index=None: False,  # copy_weight_: a plain copy_ on the CPU
        make_synced_weight_loader=lambda loader: loader,
    )
    for name in (
        root,
        f"{root}.model_executor",
        f"{root}.model_executor.layers",
        f"{root}.model_executor.layers.quantization",
        f"{root}.model_executor.model_loader",
        f"{root}.model_executor.models",
        f"{root}.utils",
    ):
        _register(_module(name, package=True))
    _register(_module(f"{root}.logger", init_logger=log.named))
    _register(
        _module(
            f"{root}.config",
            ModelConfig=ModelConfig,
            VllmConfig=VllmConfig,
            get_current_vllm_config_or_none=lambda: None,
        )
    )
    # The settings the reload package reads, at their defaults (in-place layerwise reload).
    _register(_module(f"{root}.envs", VLLM_RELOAD_MODE="layerwise"))
    _register(_module(f"{root}.platforms", current_platform=platform))
    _register(_module(f"{root}.utils.torch_utils", is_torch_equal_or_newer=lambda version: True))
    _register(
        _module(
            f"{root}.model_executor.layers.attention",
            is_deferred_attention_layer=lambda layer: False,
        )
    )
    _register(
        _module(
            f"{root}.model_executor.layers.quantization.base_config",
            QuantizeMethodBase=QuantizeMethodBase,
        )
    )
    _register(
        _module(f"{root}.model_executor.layers.logits_processor", LogitsProcessor=LogitsProcessor)
    )
    _register(
        _module(
            f"{root}.model_executor.layers.vocab_parallel_embedding",
            VocabParallelEmbedding=VocabParallelEmbedding,
            ParallelLMHead=ParallelLMHead,
        )
    )
    _register(
        _module(f"{root}.model_executor.models.interfaces", supports_multimodal=lambda model: False)
    )
    _register(_model_loader_utils(root))
    _register(
        _module(
            f"{root}.model_executor.models.interfaces_base",
            VllmModelForPooling=VllmModelForPooling,
        )
    )


def _model_loader_utils(root: str) -> types.ModuleType:
    """``model_loader/utils.py`` as the reload package uses it on the CPU, with no quantized
    module: ``device_loading_context`` leaves a module where it is (upstream's own branch for a
    CPU or absent target), and ``process_weights_after_loading`` is what upstream's does for
    such a model (record the checkpoint layout at cold start in direct mode, then every
    module's post-load hook). Both resolve the version's own modules when called."""

    @contextlib.contextmanager
    def device_loading_context(module, target_device):
        yield module

    def process_weights_after_loading(model, model_config, target_device):
        direct = sys.modules[f"{root}.model_executor.model_loader.reload.direct"]
        if direct.direct_reload_enabled():
            direct.record_checkpoint_layout(model)
        weight_utils = sys.modules[f"{root}.model_executor.model_loader.weight_utils"]
        weight_utils.finalize_model_weights(model, target_device)

    return _module(
        f"{root}.model_executor.model_loader.utils",
        device_loading_context=device_loading_context,
        process_weights_after_loading=process_weights_after_loading,
    )


# --- the one edit: each version's own package name -----------------------------------------------


class _Rooted(ast.NodeTransformer):
    """Absolute imports of ``vllm`` and its modules read from ``root`` instead."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _moved(self, name: str) -> str | None:
        if name == UPSTREAM or name.startswith(UPSTREAM + "."):
            return self.root + name[len(UPSTREAM) :]
        return None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.ImportFrom:
        moved = self._moved(node.module or "") if node.level == 0 else None
        if moved is not None:
            node.module = moved
        return node

    def visit_Import(self, node: ast.Import) -> ast.Import:
        names: list[ast.alias] = []
        for alias in node.names:
            moved = self._moved(alias.name)
            if moved is None:
                names.append(alias)
            elif alias.asname is not None:
                names.append(ast.alias(moved, alias.asname))
            else:  # `import vllm.envs` binds `vllm`: the submodule, then the package as `vllm`
                names += [ast.alias(moved), ast.alias(self.root, UPSTREAM)]
        node.names = names
        return node


def _compile(tree: ast.Module, path: Path, root: str) -> types.CodeType:
    # dont_inherit: this file's ``from __future__ import annotations`` must not leak into the
    # upstream code (it would stop dataclass and signature annotations from being evaluated).
    tree = ast.fix_missing_locations(_Rooted(root).visit(tree))
    return compile(tree, str(path), "exec", dont_inherit=True)


class _SourceFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``<root>.x.y`` from ``<src>/vllm/x/y.py`` (or ``.../y/__init__.py``), compiled
    with ``_compile``: only the files fetch.py extracted exist there."""

    def __init__(self, root: str, src: Path) -> None:
        self.root, self.src = root, src

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.root + "."):
            return None
        base = self.src / UPSTREAM / Path(*fullname.split(".")[1:])
        if (base / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(
                fullname, base / "__init__.py", loader=self, submodule_search_locations=[]
            )
        if base.with_suffix(".py").is_file():
            return importlib.util.spec_from_file_location(
                fullname, base.with_suffix(".py"), loader=self
            )
        return None

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        path = Path(module.__spec__.origin)
        tree = ast.parse(path.read_text(), filename=str(path))
        exec(_compile(tree, path, self.root), module.__dict__)


# --- executing chosen definitions of a module ----------------------------------------------------


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    return []


def _import_bindings(stmt: ast.stmt) -> dict[str, ast.stmt]:
    """name -> an import statement binding only that name (same module, same level)."""
    out: dict[str, ast.stmt] = {}
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            name = alias.asname or alias.name.split(".")[0]
            out[name] = ast.Import(names=[alias])
    elif isinstance(stmt, ast.ImportFrom):
        for alias in stmt.names:
            out[alias.asname or alias.name] = ast.ImportFrom(
                module=stmt.module, names=[alias], level=stmt.level
            )
    for node in out.values():
        ast.copy_location(node, stmt)
    return out


def _global_loads(code: types.CodeType) -> set[str]:
    """Names a code object (and its nested functions and classes) reads from module globals."""
    names: set[str] = set()
    stored: set[str] = set()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            names.add(ins.argval)
        elif ins.opname == "STORE_NAME":
            stored.add(ins.argval)  # a class body's own names
    names -= stored
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_loads(const)
    return names


@dataclass(frozen=True)
class Extracted:
    """Which upstream lines a harness module runs (reported in the test header)."""

    path: str
    spans: tuple[tuple[str, int, int], ...]  # (name, first line, last line)


def top_level_names(path: Path) -> set[str]:
    """Every name a file binds at top level (definitions and assignments)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {name for stmt in tree.body for name in _bound_names(stmt)}


def exec_definitions(
    path: Path, module_name: str, wanted: tuple[str, ...]
) -> tuple[types.ModuleType, Extracted]:
    """A module holding ``wanted`` (and what they need) from the upstream file at ``path``;
    ``module_name``'s first component is the version's package (``vllm_0_34_0``)."""
    root = module_name.split(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    defs: dict[str, ast.stmt] = {}
    twice: set[str] = set()  # @overload stubs and the like: never taken
    imports: dict[str, ast.stmt] = {}
    for stmt in tree.body:
        for name in _bound_names(stmt):
            if name in defs:
                twice.add(name)
            defs[name] = stmt
        imports.update(_import_bindings(stmt))

    chosen: dict[int, ast.stmt] = {}  # by position in the file, to keep upstream's order
    chosen_imports: dict[str, ast.stmt] = {}
    todo = list(wanted)
    while todo:
        name = todo.pop()
        if name in imports:
            chosen_imports.setdefault(name, imports[name])
            continue
        if name in twice:
            raise RuntimeError(f"{path}: {name} is defined more than once at top level")
        stmt = defs.get(name)
        if stmt is None:
            if hasattr(builtins, name) or (name.startswith("__") and name.endswith("__")):
                continue
            raise RuntimeError(f"{path}: no top-level definition or import of {name!r}")
        if id(stmt) in {id(s) for s in chosen.values()}:
            continue
        chosen[tree.body.index(stmt)] = stmt
        code = _compile(ast.Module(body=[stmt], type_ignores=[]), path, root)
        todo.extend(_global_loads(code) - {name})

    body = list(chosen_imports.values()) + [chosen[i] for i in sorted(chosen)]
    module = _module(module_name, __file__=str(path))
    code = _compile(ast.Module(body=body, type_ignores=[]), path, root)
    _register(module)
    exec(code, module.__dict__)
    spans = tuple(
        (", ".join(_bound_names(s)), s.lineno, s.end_lineno or s.lineno)
        for s in (chosen[i] for i in sorted(chosen))
    )
    return module, Extracted(str(path), spans)


def _present(path: Path, names: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``names`` that ``path`` defines (a version may lack some)."""
    have = top_level_names(path)
    return tuple(n for n in names if n in have)


# --- the upstream surface the tests use ----------------------------------------------------------


@dataclass
class Upstream:
    version: str
    root: str  # the package this version lives in (root_of(version))
    src: Path
    log: LogRecorder
    utils: types.ModuleType
    weight_utils: types.ModuleType
    adapters: types.ModuleType
    reload: types.ModuleType
    meta: types.ModuleType
    layerwise: types.ModuleType
    extracted: tuple[Extracted, ...]

    def module(self, name: str) -> types.ModuleType:
        """This version's module ``vllm.<name>`` (stub or upstream), e.g. ``"envs"``."""
        return sys.modules[f"{self.root}.{name}"]

    @property
    def WeightsMapper(self):
        return self.utils.WeightsMapper

    @property
    def AutoWeightsLoader(self):
        return self.utils.AutoWeightsLoader

    @property
    def default_weight_loader(self):
        return self.weight_utils.default_weight_loader

    @property
    def composed_weight_loader(self):
        return self.weight_utils.composed_weight_loader

    @property
    def get_numel_loaded(self):
        return self.meta.get_numel_loaded

    def pooling_class(self, cls: type) -> type:
        """Upstream's pooling subclass of ``cls`` (its constructor takes ``vllm_config=``)."""
        return self.adapters._create_pooling_model_cls(cls)


_LOADED: dict[str, Upstream] = {}


def load_upstream(version: str, src: Path) -> Upstream:
    """vLLM ``version``'s loading code from its extracted sources at ``src`` (once per version;
    ``fetch.ensure_sources(version)`` gives ``src``)."""
    if version in _LOADED:
        if _LOADED[version].src != src:
            raise RuntimeError(f"vllm {version} is already loaded from {_LOADED[version].src}")
        return _LOADED[version]
    root = root_of(version)
    if root in sys.modules:
        raise RuntimeError(f"{root} is already a module here: the harness would shadow it")
    log = LogRecorder()
    _install_stubs(log, root)
    sys.meta_path.insert(0, _SourceFinder(root, src))  # before the path finder: every file
    pkg = src / UPSTREAM / "model_executor"
    _, x_executor = exec_definitions(
        pkg / "utils.py",
        f"{root}.model_executor.utils",
        _present(
            pkg / "utils.py",
            ("set_weight_attrs", "copy_weight_", "storage_view", "weights_already_processed",
             "is_weights_pre_processed"),
        ),
    )  # fmt: skip
    weight_utils, x_weight = exec_definitions(
        pkg / "model_loader" / "weight_utils.py",
        f"{root}.model_executor.model_loader.weight_utils",
        _present(
            pkg / "model_loader" / "weight_utils.py",
            ("default_weight_loader", "composed_weight_loader", "finalize_model_weights"),
        ),
    )
    reload_pkg = importlib.import_module(f"{root}.model_executor.model_loader.reload")
    utils, x_utils = exec_definitions(
        pkg / "models" / "utils.py",
        f"{root}.model_executor.models.utils",
        ("WeightsMapper", "AutoWeightsLoader", "no_init_weights", "StageMissingLayer"),
    )
    adapters, x_adapters = exec_definitions(
        pkg / "models" / "adapters.py",
        f"{root}.model_executor.models.adapters",
        ("_create_pooling_model_cls",),
    )
    up = Upstream(
        version=version,
        root=root,
        src=src,
        log=log,
        utils=utils,
        weight_utils=weight_utils,
        adapters=adapters,
        reload=reload_pkg,
        meta=sys.modules[f"{root}.model_executor.model_loader.reload.meta"],
        layerwise=sys.modules[f"{root}.model_executor.model_loader.reload.layerwise"],
        extracted=(x_executor, x_weight, x_utils, x_adapters),
    )
    _LOADED[version] = up
    return up
