"""vLLM 0.28.0's own loading code, executed unchanged next to loadkit.

The wheel cannot be imported (it needs CUDA and half of PyPI), so the harness builds just enough
of the ``vllm`` package for the definitions under test:

- the layerwise-reload package (``model_loader/reload/*.py``) is imported as it is, file by file;
- from the three big modules (``models/utils.py``, ``models/adapters.py``,
  ``model_loader/weight_utils.py``) only the named top-level definitions are taken, with ``ast``,
  together with whatever they reference: other definitions of the same file and the file's own
  import statements for those names. The code objects are compiled from the upstream file (same
  file name and line numbers in tracebacks); no statement is edited.

What the upstream definitions import from the rest of ``vllm`` is stubbed in ``sys.modules``, and
nothing else: a logger that records every call (tests read upstream's debug counters from it),
empty classes for type checks that must fail (``QuantizeMethodBase``, ``LogitsProcessor``, ...),
and two predicates answering ``False`` (no attention layers, no multimodal models).
"""

from __future__ import annotations

import ast
import builtins
import dis
import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = "vllm"


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


def _install_stubs(log: LogRecorder) -> None:
    class ModelConfig:  # only imported for annotations and signatures
        pass

    class VllmConfig:
        pass

    class QuantizeMethodBase:  # no layer in the tests is quantized: isinstance is False
        pass

    class LogitsProcessor(torch.nn.Module):  # the pooling adapter replaces these: none exist
        pass

    class ParallelLMHead(torch.nn.Module):
        pass

    class VllmModelForPooling:  # a mixin of the pooling class; its protocol adds no behaviour
        pass

    for name in (
        ROOT,
        f"{ROOT}.model_executor",
        f"{ROOT}.model_executor.layers",
        f"{ROOT}.model_executor.layers.quantization",
        f"{ROOT}.model_executor.model_loader",
        f"{ROOT}.model_executor.models",
    ):
        _register(_module(name, package=True))
    _register(_module(f"{ROOT}.logger", init_logger=log.named))
    _register(_module(f"{ROOT}.config", ModelConfig=ModelConfig, VllmConfig=VllmConfig))
    _register(
        _module(
            f"{ROOT}.model_executor.layers.attention",
            is_deferred_attention_layer=lambda layer: False,
        )
    )
    _register(
        _module(
            f"{ROOT}.model_executor.layers.quantization.base_config",
            QuantizeMethodBase=QuantizeMethodBase,
        )
    )
    _register(
        _module(f"{ROOT}.model_executor.layers.logits_processor", LogitsProcessor=LogitsProcessor)
    )
    _register(
        _module(
            f"{ROOT}.model_executor.layers.vocab_parallel_embedding", ParallelLMHead=ParallelLMHead
        )
    )
    _register(
        _module(f"{ROOT}.model_executor.models.interfaces", supports_multimodal=lambda model: False)
    )
    _register(
        _module(
            f"{ROOT}.model_executor.models.interfaces_base",
            VllmModelForPooling=VllmModelForPooling,
        )
    )


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


def _compile(tree: ast.Module, path: Path) -> types.CodeType:
    # dont_inherit: this file's ``from __future__ import annotations`` must not leak into the
    # upstream code (it would stop dataclass and signature annotations from being evaluated).
    return compile(tree, str(path), "exec", dont_inherit=True)


@dataclass(frozen=True)
class Extracted:
    """Which upstream lines a harness module runs (reported in the test header)."""

    path: str
    spans: tuple[tuple[str, int, int], ...]  # (name, first line, last line)


def exec_definitions(
    path: Path, module_name: str, wanted: tuple[str, ...]
) -> tuple[types.ModuleType, Extracted]:
    """A module holding ``wanted`` (and what they need) from the upstream file at ``path``."""
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
        code = _compile(ast.Module(body=[stmt], type_ignores=[]), path)
        todo.extend(_global_loads(code) - {name})

    body = list(chosen_imports.values()) + [chosen[i] for i in sorted(chosen)]
    module = _module(module_name, __file__=str(path))
    code = _compile(ast.Module(body=body, type_ignores=[]), path)
    _register(module)
    exec(code, module.__dict__)
    spans = tuple(
        (", ".join(_bound_names(s)), s.lineno, s.end_lineno or s.lineno)
        for s in (chosen[i] for i in sorted(chosen))
    )
    return module, Extracted(str(path), spans)


def _import_file(name: str, path: Path, *, package: bool = False) -> types.ModuleType:
    locations = [str(path.parent)] if package else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=locations)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    _register(module)
    spec.loader.exec_module(module)
    return module


# --- the upstream surface the tests use ----------------------------------------------------------


@dataclass
class Upstream:
    log: LogRecorder
    utils: types.ModuleType
    weight_utils: types.ModuleType
    adapters: types.ModuleType
    reload: types.ModuleType
    meta: types.ModuleType
    layerwise: types.ModuleType
    extracted: tuple[Extracted, ...]

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


def load_upstream(src: Path) -> Upstream:
    """Build the ``vllm`` stand-in package from the extracted sources at ``src`` (once)."""
    key = str(src)
    if key in _LOADED:
        return _LOADED[key]
    if _LOADED:
        raise RuntimeError("the upstream harness is already loaded from another source folder")
    if ROOT in sys.modules or importlib.util.find_spec(ROOT) is not None:
        raise RuntimeError(
            "a real 'vllm' is importable here; the harness would shadow it. Run the "
            "differential tests in an environment without vllm installed."
        )
    log = LogRecorder()
    _install_stubs(log)
    pkg = src / ROOT / "model_executor"
    weight_utils, x_weight = exec_definitions(
        pkg / "model_loader" / "weight_utils.py",
        f"{ROOT}.model_executor.model_loader.weight_utils",
        ("default_weight_loader", "composed_weight_loader"),
    )
    reload_pkg = _import_file(
        f"{ROOT}.model_executor.model_loader.reload",
        pkg / "model_loader" / "reload" / "__init__.py",
        package=True,
    )
    utils, x_utils = exec_definitions(
        pkg / "models" / "utils.py",
        f"{ROOT}.model_executor.models.utils",
        ("WeightsMapper", "AutoWeightsLoader", "no_init_weights", "StageMissingLayer"),
    )
    adapters, x_adapters = exec_definitions(
        pkg / "models" / "adapters.py",
        f"{ROOT}.model_executor.models.adapters",
        ("_create_pooling_model_cls",),
    )
    up = Upstream(
        log=log,
        utils=utils,
        weight_utils=weight_utils,
        adapters=adapters,
        reload=reload_pkg,
        meta=sys.modules[f"{ROOT}.model_executor.model_loader.reload.meta"],
        layerwise=sys.modules[f"{ROOT}.model_executor.model_loader.reload.layerwise"],
        extracted=(x_weight, x_utils, x_adapters),
    )
    _LOADED[key] = up
    return up
