"""vLLM 0.34.0's native classes, their loading half, executed from the wheel's source on
loadkit's module trees.

loadkit re-implements vLLM's native classes (``loadkit.models.native``): their module trees,
parameter names and ``load_weights``. This harness takes the other half from the wheel: the
loading code of each class, compiled from the upstream file (same file names and line numbers)
and put in place of loadkit's on a loadkit model of the same config. What then runs is vLLM's:

- the models' own ``load_weights`` (``LlamaForCausalLM``, ``LlamaModel``, ``Qwen2MoeForCausalLM``,
  ``DeepseekV2Model``'s hand-written loop, ``GptOssModel``'s, ...) with the helpers they call
  (``maybe_remap_mistral``, ``_load_weights_other``, ``get_expert_mapping``...), their mappers
  (``hf_to_vllm_mapper``, built with upstream's ``WeightsMapper``) and the module functions they
  read (``maybe_remap_kv_scale_name``, ``remap_moe_expert_weights``, ...);
- ``AutoWeightsLoader`` and ``WeightsMapper`` (``models/utils.py``);
- the layers' ``load_weights``: ``MergedColumnParallelLinear`` and ``QKVParallelLinear``
  (``layers/linear.py``), ``MoERunner`` (``fused_moe/runner/moe_runner.py``), ``RoutedExperts``
  with its expert mapping (``fused_moe/routed_experts.py``, ``make_expert_params_mapping``,
  ``build_expert_params_mapping`` and EPLB's ``build_initial_global_physical_to_logical_map``);
- ``DefaultModelLoader.track_weights_loading``, the check that follows every load.

What stays loadkit's: the module tree and its parameters, and the per-parameter
``weight_loader``s (tests/upstream/test_weight_loaders_upstream.py holds those against
upstream's). An upstream class's members are bound to a loadkit module by a subclass of both
(the upstream members first); a loadkit class that loads in its own way and has no upstream
counterpart in ``COUNTERPARTS`` is an error, never a silent fallback to loadkit's code.

Where upstream reads serving state loadkit does not model, the counterpart supplies it at its
one-rank value: no redundant experts, no fused shared experts, no expert parallelism. The
distributed groups are one rank; ROCm's AITER is off.
"""

from __future__ import annotations

import ast
import builtins
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from upstream.harness import (
    LogRecorder,
    _bound_names,
    _compile,
    _global_loads,
    _import_bindings,
    _install_stubs,
    _module,
    _register,
    _SourceFinder,
    exec_definitions,
    root_of,
)

VERSION = "0.34.0"
ROOT = root_of(VERSION) + "_native"  # a package of its own: its stubs are loadkit's layers

MODELS = "model_executor/models"
LAYERS = "model_executor/layers"


@dataclass(frozen=True)
class Counterpart:
    """The upstream class whose members replace a loadkit class's: ``members`` (methods and
    class attributes) of ``cls`` in ``path``; ``serving``: the one-rank value of serving state
    upstream reads and loadkit does not model."""

    path: str  # relative to the wheel's vllm/
    cls: str
    members: tuple[str, ...]
    serving: tuple[tuple[str, Any], ...] = ()


_ONE_RANK_MOE = (("fused_shared_expert_layers", frozenset()), ("num_redundant_experts", 0))

# loadkit class name -> its upstream counterpart (the first match along the loadkit class's MRO)
COUNTERPARTS: dict[str, Counterpart] = {
    "MergedColumnParallelLinear": Counterpart(
        f"{LAYERS}/linear.py", "MergedColumnParallelLinear", ("load_weights",)
    ),
    "QKVParallelLinear": Counterpart(f"{LAYERS}/linear.py", "QKVParallelLinear", ("load_weights",)),
    "RoutedExperts": Counterpart(
        f"{LAYERS}/fused_moe/routed_experts.py",
        "RoutedExperts",
        (
            "load_weights",
            "get_expert_mapping",
            "make_expert_params_mapping",
            "build_expert_params_mapping",
            "_orient_fused_weight",
        ),
    ),
    "MoERunner": Counterpart(
        f"{LAYERS}/fused_moe/runner/moe_runner.py", "MoERunner", ("load_weights",)
    ),
    "LlamaModel": Counterpart(
        f"{MODELS}/llama.py", "LlamaModel", ("hf_to_vllm_mapper", "load_weights")
    ),
    "LlamaForCausalLM": Counterpart(
        f"{MODELS}/llama.py", "LlamaForCausalLM", ("hf_to_vllm_mapper", "load_weights")
    ),
    "MistralForCausalLM": Counterpart(
        f"{MODELS}/mistral.py",
        "MistralForCausalLM",
        (
            "load_weights",
            "maybe_remap_mistral",
            "mistral_mapping",
        ),
    ),
    "Qwen2Model": Counterpart(
        f"{MODELS}/qwen2.py", "Qwen2Model", ("hf_to_vllm_mapper", "load_weights")
    ),
    "Qwen2ForCausalLM": Counterpart(
        f"{MODELS}/qwen2.py", "Qwen2ForCausalLM", ("hf_to_vllm_mapper", "load_weights")
    ),
    "Qwen3ForCausalLM": Counterpart(
        f"{MODELS}/qwen3.py", "Qwen3ForCausalLM", ("hf_to_vllm_mapper", "load_weights")
    ),
    "GPT2Model": Counterpart(
        f"{MODELS}/gpt2.py", "GPT2Model", ("hf_to_vllm_mapper", "load_weights", "_transpose_conv1d")
    ),
    "GPT2LMHeadModel": Counterpart(f"{MODELS}/gpt2.py", "GPT2LMHeadModel", ("load_weights",)),
    "Gemma2ForCausalLM": Counterpart(
        f"{MODELS}/gemma2.py", "Gemma2ForCausalLM", ("hf_to_vllm_mapper", "load_weights")
    ),
    "Gemma3Model": Counterpart(
        f"{MODELS}/gemma3.py", "Gemma3Model", ("hf_to_vllm_mapper", "load_weights")
    ),
    "Gemma3ForCausalLM": Counterpart(
        f"{MODELS}/gemma3.py", "Gemma3ForCausalLM", ("hf_to_vllm_mapper", "load_weights")
    ),
    "MixtralModel": Counterpart(
        f"{MODELS}/mixtral.py", "MixtralModel", ("hf_to_vllm_mapper", "load_weights")
    ),
    "MixtralForCausalLM": Counterpart(
        f"{MODELS}/mixtral.py", "MixtralForCausalLM", ("hf_to_vllm_mapper", "load_weights")
    ),
    "Qwen2MoeForCausalLM": Counterpart(
        f"{MODELS}/qwen2_moe.py", "Qwen2MoeForCausalLM", ("hf_to_vllm_mapper", "load_weights")
    ),
    "Qwen3MoeModel": Counterpart(
        f"{MODELS}/qwen3_moe.py", "Qwen3MoeModel", ("hf_to_vllm_mapper", "load_weights")
    ),
    "Qwen3MoeForCausalLM": Counterpart(
        f"{MODELS}/qwen3_moe.py", "Qwen3MoeForCausalLM", ("hf_to_vllm_mapper", "load_weights")
    ),
    "DeepseekV2Model": Counterpart(
        f"{MODELS}/deepseek_v2.py", "DeepseekV2Model", ("load_weights",), _ONE_RANK_MOE
    ),
    "DeepseekV2ForCausalLM": Counterpart(
        f"{MODELS}/deepseek_v2.py", "DeepseekV2ForCausalLM", ("load_weights",)
    ),
    "GptOssModel": Counterpart(
        f"{MODELS}/gpt_oss.py",
        "GptOssModel",
        (
            "load_weights",
            "_load_weights_other",
            "_try_load_streamed_expert",
            "_get_streamed_expert_info",
        ),
        (("parallel_config", types.SimpleNamespace(enable_expert_parallel=False)),),
    ),
    "GptOssForCausalLM": Counterpart(
        f"{MODELS}/gpt_oss.py", "GptOssForCausalLM", ("hf_to_vllm_mapper", "load_weights")
    ),
    "Qwen2_5_VisionTransformer": Counterpart(
        f"{MODELS}/qwen2_5_vl.py",
        "Qwen2_5_VisionTransformer",
        ("hf_to_vllm_mapper", "load_weights"),
    ),
    "Qwen2_5_VLForConditionalGeneration": Counterpart(
        f"{MODELS}/qwen2_5_vl.py",
        "Qwen2_5_VLForConditionalGeneration",
        ("hf_to_vllm_mapper", "load_weights"),
    ),
}
# Upstream classes the counterparts read a member of, not bound to a loadkit class themselves
# (``Qwen3ForCausalLM.hf_to_vllm_mapper = Qwen3Model.hf_to_vllm_mapper``): only their bases.
READ_ONLY: dict[str, dict[str, tuple[str, ...]]] = {
    f"{MODELS}/qwen3.py": {"Qwen3Model": ()},
}
# loadkit classes that load as a counterpart further up their MRO, or not on their own: no
# upstream members of their own (vLLM's Phi3ForCausalLM, Qwen3Model, ... add none either).
INHERITED = frozenset(
    {"Phi3ForCausalLM", "Qwen3Model", "Gemma2Model", "Qwen2MoeModel", "DeepseekV3ForCausalLM"}
)


# --- compiling chosen members of upstream classes -------------------------------------------------


def _strip_annotations(node: ast.AST) -> None:
    """Annotations go: the upstream files evaluate them lazily (``from __future__ import
    annotations``) and name types only imported for the type checker."""
    for fn in ast.walk(node):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn.returns = None
            args = fn.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None:
                    arg.annotation = None


def _members(cls: ast.ClassDef, wanted: tuple[str, ...], keep_bases: set[str]) -> ast.ClassDef:
    body: list[ast.stmt] = []
    for stmt in cls.body:
        names = _bound_names(stmt)
        if any(n in wanted for n in names):
            body.append(stmt)
        elif isinstance(stmt, ast.AnnAssign) and getattr(stmt.target, "id", None) in wanted:
            body.append(stmt)
    found = {n for s in body for n in _bound_names(s)}
    missing = set(wanted) - found
    if missing:
        raise RuntimeError(f"{cls.name} has no {sorted(missing)}")
    bases = [b for b in cls.bases if isinstance(b, ast.Name) and b.id in keep_bases]
    out = ast.ClassDef(
        name=cls.name,
        bases=bases,
        keywords=[],
        body=body or [ast.Pass()],
        decorator_list=[],
        type_params=[],
    )
    _strip_annotations(out)
    return ast.copy_location(out, cls)


def exec_members(
    path: Path,
    module_name: str,
    classes: dict[str, tuple[str, ...]],
    keep_bases: set[str],
    provided: dict[str, Any] | None = None,
) -> types.ModuleType:
    """A module holding, for each ``classes`` entry, a class of that name with only the named
    members, compiled from the upstream file at ``path``; with what they read: the file's own
    imports for those names and its top-level definitions (recursively). ``provided`` names
    are given instead of imported; a base class is kept only when named in ``keep_bases``."""
    root = module_name.split(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    defs: dict[str, ast.stmt] = {}
    imports: dict[str, ast.stmt] = {}
    for stmt in tree.body:
        for name in _bound_names(stmt):
            defs[name] = stmt
        imports.update(_import_bindings(stmt))
    provided = dict(provided or {})
    chosen: dict[int, ast.stmt] = {}
    for name, wanted in classes.items():
        cls = defs[name]
        assert isinstance(cls, ast.ClassDef), name
        chosen[tree.body.index(cls)] = _members(cls, wanted, keep_bases)
    chosen_imports: dict[str, ast.stmt] = {}
    todo = [n for s in chosen.values() for n in _global_loads(_compile_one(s, path, root))]
    while todo:
        name = todo.pop()
        if name in provided or name in classes or name in chosen_imports:
            continue
        if name in imports:
            chosen_imports[name] = imports[name]
            continue
        stmt = defs.get(name)
        if stmt is None:
            if hasattr(builtins, name) or name.startswith("__"):
                continue
            raise RuntimeError(f"{path}: no top-level definition or import of {name!r}")
        if tree.body.index(stmt) in chosen:
            continue
        _strip_annotations(stmt)
        chosen[tree.body.index(stmt)] = stmt
        todo.extend(_global_loads(_compile_one(stmt, path, root)) - {name})
    body = list(chosen_imports.values()) + [chosen[i] for i in sorted(chosen)]
    module = _module(module_name, __file__=str(path))
    module.__dict__.update(provided)
    _register(module)
    exec(_compile(ast.Module(body=body, type_ignores=[]), path, root), module.__dict__)
    return module


def _compile_one(stmt: ast.stmt, path: Path, root: str) -> types.CodeType:
    return _compile(ast.Module(body=[stmt], type_ignores=[]), path, root)


# --- the package: stubs, then upstream's modules in dependency order ------------------------------


class _Group:
    """A distributed group of one rank."""

    world_size = 1
    rank_in_group = 0
    device_group = None


class _Aiter:
    """ROCm's AITER kernels: off."""

    @staticmethod
    def is_fusion_moe_shared_experts_enabled() -> bool:
        return False

    @staticmethod
    def is_fused_moe_enabled() -> bool:
        return False


class _FusedMoEParallelConfig:
    @staticmethod
    def flatten_tp_across_dp_and_pcp(tp_size, dp_size, dp_rank, pcp_size, pcp_rank):
        return tp_size, 0  # one rank: no data or context parallelism to fold in


class _Unused:
    """Stands for what only quantized checkpoints reach (fp8 scales, ...)."""

    def __init__(self, *_: Any, **__: Any) -> None:
        raise AssertionError("a quantized path was taken on an unquantized model")


def _stubs(root: str, log: LogRecorder) -> None:
    from loadkit.parallel.linear import StackedColumnParallelLinear
    from loadkit.parallel.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    _install_stubs(log, root)
    # AutoWeightsLoader finds tied embeddings by class: loadkit's layers are the ones built
    _register(
        _module(
            f"{root}.model_executor.layers.vocab_parallel_embedding",
            VocabParallelEmbedding=VocabParallelEmbedding,
            ParallelLMHead=ParallelLMHead,
        )
    )
    for name in (
        f"{root}.distributed",
        f"{root}.distributed.eplb",
        f"{root}.model_executor.layers.fused_moe",
        f"{root}.model_executor.layers.fused_moe.runner",
        f"{root}.model_executor.layers.quantization.utils",
    ):
        _register(_module(name, package=True))
    group = _Group()
    dist = sys.modules[f"{root}.distributed"]
    dist.__dict__.update(
        get_ep_group=lambda: group,
        get_dp_group=lambda: group,
        get_pcp_group=lambda: group,
        get_tensor_model_parallel_world_size=lambda: 1,
    )
    _register(_module(f"{root}._aiter_ops", rocm_aiter_ops=_Aiter()))
    _register(_module(f"{root}.utils.math_utils", cdiv=lambda a, b: -(-a // b)))
    _register(
        _module(
            f"{root}.model_executor.layers.fused_moe.config",
            FusedMoEParallelConfig=_FusedMoEParallelConfig,
        )
    )
    _register(
        _module(
            f"{root}.model_executor.layers.quantization.utils.quant_utils",
            GroupShape=_Unused,
            scaled_dequantize=_Unused,
        )
    )
    _register(
        _module(
            f"{root}.model_executor.layers.quantization.kv_cache",
            BaseKVCacheMethod=type("BaseKVCacheMethod", (), {}),
        )
    )
    # the track reads StackedColumnParallelLinear from here, the layers' load_weights are added
    _register(
        _module(
            f"{root}.model_executor.layers.linear",
            StackedColumnParallelLinear=StackedColumnParallelLinear,
        )
    )


@dataclass
class NativeUpstream:
    """vLLM 0.34.0's loading half of its native classes, ready to bind onto loadkit models."""

    root: str
    src: Path
    log: LogRecorder
    counterparts: dict[str, type]  # loadkit class name -> upstream's class of those members
    track_weights_loading: Any  # DefaultModelLoader.track_weights_loading, unbound
    default_weight_loader: Any
    _swapped: dict[type, type]

    def bind(self, model: nn.Module) -> nn.Module:
        """``model`` (loadkit's) with upstream's members in place of loadkit's, module by
        module; returns it."""
        for module in model.modules():
            module.__class__ = self._upstream_class(type(module))
        return model

    def _upstream_class(self, cls: type) -> type:
        if cls in self._swapped:
            return self._swapped[cls]
        found = counterpart = None
        for klass in cls.__mro__:
            if klass.__name__ in self.counterparts:
                found, counterpart = self.counterparts[klass.__name__], COUNTERPARTS[klass.__name__]
                break
            own = "load_weights" in vars(klass) and klass.__name__ not in INHERITED
            if own:
                raise RuntimeError(
                    f"{klass.__name__} loads in its own way: no upstream counterpart"
                )
        if found is None or counterpart is None:
            self._swapped[cls] = cls
            return cls
        extra: dict[str, Any] = dict(counterpart.serving)
        if "load_weights" not in _all_members(found) and hasattr(cls, "load_weights"):
            extra["load_weights"] = None  # upstream's class loads through its parent's walk
        swapped = type(f"Upstream{cls.__name__}", (found, cls), extra)
        self._swapped[cls] = swapped
        return swapped


def _all_members(cls: type) -> set[str]:
    return {name for klass in cls.__mro__ if klass is not object for name in vars(klass)}


_LOADED: dict[Path, NativeUpstream] = {}


def load_native(src: Path) -> NativeUpstream:
    """vLLM 0.34.0's native loading code from its extracted sources at ``src`` (once)."""
    if src in _LOADED:
        return _LOADED[src]
    if ROOT in sys.modules:
        raise RuntimeError(f"{ROOT} is already a module here")
    log = LogRecorder()
    _stubs(ROOT, log)
    sys.meta_path.insert(0, _SourceFinder(ROOT, src))
    pkg = src / "vllm"
    ex = pkg / "model_executor"
    exec_definitions(
        ex / "utils.py",
        f"{ROOT}.model_executor.utils",
        (
            "set_weight_attrs",
            "copy_weight_",
            "storage_view",
            "weights_already_processed",
            "is_weights_pre_processed",
        ),
    )
    weight_utils, _ = exec_definitions(
        ex / "model_loader" / "weight_utils.py",
        f"{ROOT}.model_executor.model_loader.weight_utils",
        (
            "default_weight_loader",
            "composed_weight_loader",
            "finalize_model_weights",  # the reload package's, imported by models/utils.py
            "maybe_remap_kv_scale_name",
            "remap_moe_expert_weights",
        ),
    )
    exec_definitions(
        ex / "models" / "utils.py",
        f"{ROOT}.model_executor.models.utils",
        (
            "WeightsMapper",
            "AutoWeightsLoader",
            "PPMissingLayer",
            "StageMissingLayer",
            "extract_layer_index",
            "get_pp_missing_layer_names",
            "get_spec_layer_idx_from_weight_name",
            "is_pp_missing_parameter",
            "maybe_prefix",
        ),
    )
    counterparts = _counterparts(pkg)
    loader = exec_members(
        ex / "model_loader" / "default_loader.py",
        f"{ROOT}.model_executor.model_loader._default_loader",
        {"DefaultModelLoader": ("track_weights_loading",)},
        set(),
    )
    native = NativeUpstream(
        ROOT,
        src,
        log,
        counterparts,
        loader.DefaultModelLoader.track_weights_loading,
        weight_utils.default_weight_loader,
        {},
    )
    _LOADED[src] = native
    return native


def _counterparts(pkg: Path) -> dict[str, type]:
    """Every counterpart class, its module registered where upstream's lives (their imports of
    each other resolve to these), in dependency order."""
    linear = sys.modules[f"{ROOT}.model_executor.layers.linear"]
    eplb = exec_members(
        pkg / "distributed" / "eplb" / "eplb_state.py",
        f"{ROOT}.distributed.eplb.eplb_state",
        {"EplbState": ("build_initial_global_physical_to_logical_map",)},
        set(),
    )
    assert eplb.EplbState is not None
    by_path: dict[str, dict[str, tuple[str, ...]]] = {}
    for c in COUNTERPARTS.values():
        by_path.setdefault(c.path, {})[c.cls] = c.members
    for path, also in READ_ONLY.items():
        by_path[path].update(also)
    keep = {c.cls for c in COUNTERPARTS.values()}
    classes: dict[str, type] = {}
    for path, wanted in by_path.items():
        name = f"{ROOT}." + path.removesuffix(".py").replace("/", ".")
        provided = {}
        if path.endswith("linear.py"):
            provided = {"StackedColumnParallelLinear": linear.StackedColumnParallelLinear}
        module = exec_members(pkg / path, name, wanted, keep, provided)
        if path.endswith("routed_experts.py"):
            _fused_moe_package(pkg)
        for cls in wanted:
            classes[cls] = getattr(module, cls)
    return {loadkit: classes[c.cls] for loadkit, c in COUNTERPARTS.items()}


def _fused_moe_package(pkg: Path) -> None:
    """``vllm.model_executor.layers.fused_moe``'s ``fused_moe_make_expert_params_mapping``
    (layer.py), which the hand-written loaders import from the package."""
    layer, _ = exec_definitions(
        pkg / LAYERS / "fused_moe" / "layer.py",
        f"{ROOT}.model_executor.layers.fused_moe.layer",
        ("fused_moe_make_expert_params_mapping",),
    )
    package = sys.modules[f"{ROOT}.model_executor.layers.fused_moe"]
    package.fused_moe_make_expert_params_mapping = layer.fused_moe_make_expert_params_mapping


# --- a load, as vLLM 0.34.0 would run it -------------------------------------------------------


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Provenance(TorchFunctionMode):
    """Follows each checkpoint tensor through every torch call of a load (a view, a permute, a
    ``contiguous`` copy carry its key on): ``reached`` holds the keys whose data went into a call
    that also took a model tensor (a ``copy_`` into a parameter, a slice assigned into one)."""

    def __init__(self, origins: dict[int, set[str]], model_storages: set[int]) -> None:
        super().__init__()
        self.origins = origins
        self.model_storages = model_storages
        self.reached: set[str] = set()
        self._alive: list[torch.Tensor] = []  # no storage freed and its address reused mid-load

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        given = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        keys: set[str] = set()
        for t in given:
            keys |= self.origins.get(_storage(t), set())
        if not keys:
            return out
        if any(_storage(t) in self.model_storages for t in given):
            self.reached |= keys
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and _storage(t) not in self.model_storages:
                self.origins.setdefault(_storage(t), set()).update(keys)
                self._alive.append(t)
        return out


# What vLLM raises for a key the model has no place for: AutoWeightsLoader's ValueError, a
# hand-written loader's KeyError on params_dict, RoutedExperts' AttributeError.
_NO_PLACE = ("There is no module or parameter named", "Attempted to load nested weight")


def no_place_for(exc: BaseException) -> bool:
    """Whether ``exc`` is vLLM's answer to a key the model has no place for."""
    if isinstance(exc, KeyError):
        return True
    if isinstance(exc, AttributeError):
        return "has no parameter" in str(exc)
    return isinstance(exc, ValueError) and any(s in str(exc) for s in _NO_PLACE)


@dataclass
class Outcome:
    """A load of one checkpoint as vLLM 0.34.0 runs it, every failing key found by loading
    again without it (vLLM stops at the first)."""

    unexpected: set[str]  # keys the model has no place for (no_place_for)
    failed: dict[str, str]  # keys whose load raised otherwise: key -> the exception, one line
    loaded: set[str]  # keys whose data reached a model tensor
    set_aside: set[str]  # keys taken without an error and loaded nowhere
    refused: set[str]  # what track_weights_loading's ValueError lists
    quiet: set[str]  # parameters left (partly) uninitialised without an error
    returned: set[str]  # what the root load_weights returned
    after_last: str | None = None  # raised with no key in flight


def read_checkpoint(path: Path) -> tuple[list[str], dict[str, torch.Tensor]]:
    """The keys in the order vLLM's ``safetensors_weights_iterator`` yields them (``safe_open``'s
    ``keys()``), each tensor with a storage of its own."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        keys = list(f.keys())
        return keys, {k: f.get_tensor(k).clone() for k in keys}


def run_upstream(
    native: NativeUpstream,
    build: Any,
    keys: list[str],
    tensors: dict[str, torch.Tensor],
) -> Outcome:
    """``build()`` (a fresh loadkit model on the CPU) loaded by upstream's code with ``keys`` in
    order, again without each key whose load raises, until a load goes through."""
    excluded: dict[str, BaseException] = {}
    while True:
        model, mode, fed = _fresh(native, build, tensors)
        try:
            with mode:
                returned = set(model.load_weights(_feed(keys, tensors, excluded, fed)))
        except Exception as exc:  # vLLM's load stops here: find the next one without this key
            if fed[-1] is None:
                return _outcome(native, model, mode, keys, excluded, set(), _line(exc))
            excluded[fed[-1]] = exc
            continue
        return _outcome(native, model, mode, keys, excluded, returned, None)


def _fresh(native, build, tensors):
    model = native.bind(build())
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    storages = {_storage(t) for t in [*model.parameters(), *model.buffers()]}
    origins = {_storage(t): {k} for k, t in tensors.items() if t.numel()}
    return model, Provenance(origins, storages), [None]


def _feed(keys, tensors, excluded, fed):
    for key in keys:
        if key in excluded:
            continue
        fed[-1] = key
        yield key, tensors[key]
    fed[-1] = None


def _line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def _outcome(native, model, mode, keys, excluded, returned, after_last) -> Outcome:
    refused: set[str] = set()
    try:
        native.track_weights_loading(None, model, set(returned))
    except ValueError as exc:
        refused = set(ast.literal_eval(str(exc).partition("checkpoint: ")[2]))
    unfilled = {n for n, p in model.named_parameters() if bool(p.isnan().any())}
    quiet = {n for n in unfilled if not any(r == n or r.startswith(n + ".") for r in refused)}
    fed = [k for k in keys if k not in excluded]
    return Outcome(
        unexpected={k for k, e in excluded.items() if no_place_for(e)},
        failed={k: _line(e) for k, e in excluded.items() if not no_place_for(e)},
        loaded={k for k in fed if k in mode.reached},
        set_aside={k for k in fed if k not in mode.reached},
        refused=refused,
        quiet=quiet,
        returned=returned,
        after_last=after_last,
    )
