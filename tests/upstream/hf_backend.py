"""vLLM 0.34.0's Transformers modeling backend, its loading half, executed from the wheel's source.

What runs unchanged (compiled from the upstream files, same file names and line numbers):

- ``transformers/base.py``: the methods of ``Base`` that decide names and loading:
  ``_create_hf_to_vllm_mapper``, ``_weight_conversions``, ``_get_tie_word_embeddings``,
  ``_vocab_embeddings``, ``init_parameters``, ``load_weights``;
- ``transformers/causal.py`` ``CausalMixin``, ``transformers/legacy.py`` ``LegacyMixin``,
  ``transformers/pooling.py`` ``EmbeddingMixin`` and ``SequenceClassificationMixin``, whole;
- ``transformers/__init__.py``: the wrapper classes ``TransformersForCausalLM``,
  ``TransformersEmbeddingModel``, ``TransformersForSequenceClassification``;
- ``config/model.py``: ``ModelConfig._get_transformers_backend_cls`` (which wrapper) and
  ``try_match_architecture_defaults`` with its ``_SUFFIX_TO_DEFAULTS`` table;
- ``model_loader/default_loader.py``: ``DefaultModelLoader.track_weights_loading`` (the "weights
  not initialized from checkpoint" check that follows every load);
- ``models/utils.py``: ``AutoWeightsLoader``, ``WeightsMapper`` (as for the other properties).

What the harness writes itself, because the upstream code needs a GPU build of vLLM:

- ``Base.__init__``: the same steps in the same order, less the serving ones (lines 123-201 of
  base.py): the ignore lists, ``AutoModel.from_config`` on the meta device, the mapper, the
  vocabulary embeddings replaced, then ``init_parameters``. ``pipeline_parallel`` returns at once
  on one rank (line 388); of ``recursive_replace`` only its vocabulary-embedding step runs, as
  the harness's ``_replace_vocab_embeddings`` (each ``nn.Embedding`` that ``_vocab_embeddings``
  names becomes a ``VocabParallelEmbedding`` with a weight of its own, a bare one replaced, a
  subclass rebased in place, a module met twice left as the first visit made it: utils.py
  ``replace_embedding_class``); its tensor-parallel layers and fusers (q/k/v and gate/up fused
  into ``qkv_proj``/``gate_up_proj`` with stacked mapper rules) and the attention instances are
  not run: loadkit keeps transformers' own modules (docs/fidelity.md);
- stubs for what the mixins construct: ``ParallelLMHead`` (a ``VocabParallelEmbedding`` with one
  ``[vocab, hidden]`` weight that ``tie_weights`` shares with the embedding, as upstream's), a
  pooler that holds nothing.
"""

from __future__ import annotations

import ast
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from upstream.harness import (
    Upstream,
    _compile,
    _import_bindings,
    _module,
    _register,
    exec_definitions,
)


def _class_methods(
    path: Path, class_name: str, methods: tuple[str, ...], module_name: str
) -> types.ModuleType:
    """The named methods of ``class_name`` in ``path``, as module-level functions compiled from
    the upstream source, with the file's own imports for the names they read."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imports: dict[str, ast.stmt] = {}
    for stmt in tree.body:
        imports.update(_import_bindings(stmt))
    cls = next(s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == class_name)
    funcs = [s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name in methods]
    missing = set(methods) - {f.name for f in funcs}
    if missing:
        raise RuntimeError(f"{path}: {class_name} has no {sorted(missing)}")
    for f in funcs:
        f.decorator_list = []  # cached_property and the like: the harness calls them plainly
    names = {n.id for f in funcs for n in ast.walk(f) if isinstance(n, ast.Name)}
    body = [imports[n] for n in sorted(names) if n in imports] + funcs
    module = _module(module_name, __file__=str(path))
    root = module_name.split(".")[0]
    exec(_compile(ast.Module(body=body, type_ignores=[]), path, root), module.__dict__)
    return module


def _lm_head_class(default_weight_loader: Any, vocab_parallel: type) -> type[nn.Module]:
    class ParallelLMHead(vocab_parallel):  # type: ignore[misc, valid-type]
        """Upstream's ``ParallelLMHead`` at one rank: a ``VocabParallelEmbedding`` with a
        ``[vocab, hidden]`` weight (unpadded: the padding is its weight loader's concern, not a
        name), ``tie_weights`` sharing the embedding's, ``_register_bias`` adding the bias
        ``CausalMixin.load_weights`` fills."""

        def __init__(self, num_embeddings: int, embedding_dim: int, **_: Any) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))
            self.weight.weight_loader = default_weight_loader
            self.bias: nn.Parameter | None = None

        def tie_weights(self, embed_tokens: nn.Module) -> nn.Module:
            self.weight = embed_tokens.weight
            return self

        def _register_bias(self) -> None:
            if self.bias is None:
                self.bias = nn.Parameter(torch.empty(self.weight.shape[0]))
                self.bias.weight_loader = default_weight_loader  # one rank: the whole bias

    return ParallelLMHead


class _Pooler:
    @staticmethod
    def for_embedding(*_: Any, **__: Any) -> None:
        return None

    @staticmethod
    def for_seq_cls(*_: Any, **__: Any) -> None:
        return None


class _Interface:  # the protocol classes the mixins inherit: no behaviour
    pass


@dataclass
class Backend:
    """The upstream backend's wrapper classes and the functions the tests call."""

    wrappers: dict[str, type]  # class name -> upstream's wrapper class
    backend_cls: Any  # ModelConfig._get_transformers_backend_cls, unbound
    track_weights_loading: Any  # DefaultModelLoader.track_weights_loading, unbound
    base_methods: types.ModuleType
    auto_weights_loader: Any  # upstream's AutoWeightsLoader

    def aliases(self, model: nn.Module) -> dict[str, str]:
        """The names upstream's ``AutoWeightsLoader`` skips as tied-embedding aliases."""
        return dict(self.auto_weights_loader(model).aliased_params)

    def wrapper_name(self, config: Any) -> str:
        """Upstream's choice of wrapper for ``config`` (``--runner auto``)."""
        model_config = types.SimpleNamespace(
            hf_config=config,
            hf_text_config=config.get_text_config(),
            is_moe=False,
            architectures=list(getattr(config, "architectures", None) or ["TransformersModel"]),
            runner="auto",
        )
        return str(self.backend_cls(model_config))

    def build(self, config: Any, wrapper: str | None = None) -> nn.Module:
        """Upstream's wrapper for ``config`` on the CPU (``wrapper`` overrides the choice)."""
        cls = self.wrappers[wrapper or self.wrapper_name(config)]
        return cls(vllm_config=_vllm_config(config))


def _vllm_config(config: Any) -> types.SimpleNamespace:
    dtype = torch.float32
    model_config = types.SimpleNamespace(
        hf_config=config,
        dtype=dtype,
        head_dtype=dtype,
        trust_remote_code=False,
        pooler_config=object(),
        quantization=None,
    )
    return types.SimpleNamespace(
        model_config=model_config,
        device_config=types.SimpleNamespace(device=torch.device("cpu")),
        load_config=types.SimpleNamespace(device=None),
        quant_config=None,
    )


def _replace_vocab_embeddings(base: nn.Module, vocab_parallel: type, loader: Any) -> None:
    """recursive_replace's vocabulary step (base.py:576-579, utils.py:263-298): each module of
    ``base._vocab_embeddings()`` becomes a ``VocabParallelEmbedding`` with a weight of its own."""
    vocab = base._vocab_embeddings()

    def replaced(emb: nn.Embedding) -> nn.Module:
        if isinstance(emb, vocab_parallel):  # tied tables are reached more than once
            return emb
        weight = nn.Parameter(torch.empty_like(emb.weight, device="cpu"))
        weight.weight_loader = loader  # a vLLM parameter: init_parameters leaves it
        if type(emb) is nn.Embedding:
            new = vocab_parallel()
            new.weight = weight
            return new
        emb.__class__ = type(type(emb).__name__, (vocab_parallel, type(emb)), {})
        emb.weight = weight
        return emb

    def walk(module: nn.Module) -> None:
        for name, child in module.named_children():
            new = replaced(child) if child in vocab else child
            if new is not child:
                setattr(module, name, new)
            elif child not in vocab:
                walk(child)

    walk(base.model)


def _base_class(methods: types.ModuleType, vocab_parallel: type, loader: Any) -> type:
    class Base(nn.Module):
        """base.py's ``Base``: ``__init__`` re-stated (see the module docstring), the loading
        methods upstream's own."""

        embedding_modules = {"embed_tokens": "input_embeddings"}  # noqa: RUF012 (upstream's)

        def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
            nn.Module.__init__(self)
            from transformers import AutoModel

            self.vllm_config = vllm_config
            self.config = vllm_config.model_config.hf_config
            self.text_config = self.config.get_text_config()
            self.device_config = vllm_config.device_config
            self.model_config = vllm_config.model_config
            self.quant_config = None
            self.pp_group = types.SimpleNamespace(is_last_rank=True, world_size=1)
            self.ignore_unexpected_prefixes: list[str] = []
            self.ignore_unexpected_suffixes: list[str] = []
            with torch.device("meta"):
                self.model = AutoModel.from_config(
                    config=self.config, dtype=self.model_config.dtype, trust_remote_code=False
                )
            self._create_hf_to_vllm_mapper()
            _replace_vocab_embeddings(self, vocab_parallel, loader)
            self.init_parameters(self.model)

        def _maybe_apply_model_mapping(self) -> None:
            pass  # a quantization config's own names: none here

        _create_hf_to_vllm_mapper = methods._create_hf_to_vllm_mapper
        _weight_conversions = methods._weight_conversions
        _get_tie_word_embeddings = methods._get_tie_word_embeddings
        _vocab_embeddings = methods._vocab_embeddings
        init_parameters = methods.init_parameters
        load_weights = methods.load_weights

    return Base


_LOADED: dict[int, Backend] = {}


def load_backend(up: Upstream, src: Path) -> Backend:
    """The backend's classes from the wheel's sources at ``src`` (once per harness)."""
    if id(up) in _LOADED:
        return _LOADED[id(up)]
    root = up.root
    backend_pkg = f"{root}.model_executor.models.transformers"
    pkg = src / "vllm"
    models = pkg / "model_executor" / "models"
    # What the mixins import from vLLM's serving stack.
    _register(_module(f"{root}.sequence", IntermediateTensors=type("IntermediateTensors", (), {})))
    _register(_module(f"{root}.config.scheduler", RunnerType=str))
    _register(_module(f"{root}.model_executor.layers.pooler", DispatchPooler=_Pooler))
    lm = sys_module(f"{root}.model_executor.layers.vocab_parallel_embedding")
    vocab_parallel = lm.VocabParallelEmbedding  # the class AutoWeightsLoader checks
    lm.ParallelLMHead = _lm_head_class(up.default_weight_loader, vocab_parallel)
    # track_weights_loading asks which modules are stacked linears: none here (no fusers run)
    _register(
        _module(
            f"{root}.model_executor.layers.linear",
            StackedColumnParallelLinear=type("StackedColumnParallelLinear", (nn.Module,), {}),
        )
    )
    _register(
        _module(
            f"{root}.model_executor.layers.quantization.kv_cache",
            BaseKVCacheMethod=type("BaseKVCacheMethod", (), {}),
        )
    )
    sys_module(f"{root}.model_executor.layers.logits_processor").LogitsProcessor = _Logits
    interfaces = sys_module(f"{root}.model_executor.models.interfaces")
    interfaces.SupportsCrossEncoding = _Interface
    base_ifaces = sys_module(f"{root}.model_executor.models.interfaces_base")
    base_ifaces.VllmModelForTextGeneration = type("VllmModelForTextGeneration", (), {})
    utils = sys_module(f"{root}.model_executor.models.utils")
    extra, _ = exec_definitions(
        models / "utils.py", f"{root}.model_executor.models._utils_extra",
        ("PPMissingLayer", "maybe_prefix"),
    )  # fmt: skip
    utils.PPMissingLayer, utils.maybe_prefix = extra.PPMissingLayer, extra.maybe_prefix
    exec_definitions(pkg / "config" / "utils.py", f"{root}.config.utils", ("getattr_iter",))

    _register(_module(backend_pkg, package=True))
    methods = _class_methods(
        models / "transformers" / "base.py",
        "Base",
        (
            "_create_hf_to_vllm_mapper",
            "_weight_conversions",
            "_get_tie_word_embeddings",
            "_vocab_embeddings",
            "init_parameters",
            "load_weights",
        ),
        f"{backend_pkg}._base_methods",
    )
    base = _base_class(methods, vocab_parallel, up.default_weight_loader)
    _register(_module(f"{backend_pkg}.base", Base=base))
    for name, wanted in (
        ("causal", ("CausalMixin",)),
        ("legacy", ("LegacyMixin",)),
        ("pooling", ("EmbeddingMixin", "SequenceClassificationMixin")),
    ):
        exec_definitions(models / "transformers" / f"{name}.py", f"{backend_pkg}.{name}", wanted)
    names = (
        "TransformersForCausalLM",
        "TransformersEmbeddingModel",
        "TransformersForSequenceClassification",
    )
    init, _ = exec_definitions(
        models / "transformers" / "__init__.py", f"{backend_pkg}._init", names
    )
    config_model = _class_methods(
        pkg / "config" / "model.py", "ModelConfig", ("_get_transformers_backend_cls",),
        f"{root}.config._model_methods",
    )  # fmt: skip
    defaults, _ = exec_definitions(
        pkg / "config" / "model.py", f"{root}.config._model_defaults",
        ("try_match_architecture_defaults",),
    )  # fmt: skip
    config_model.try_match_architecture_defaults = defaults.try_match_architecture_defaults
    loader = _class_methods(
        pkg / "model_executor" / "model_loader" / "default_loader.py", "DefaultModelLoader",
        ("track_weights_loading",), f"{root}.model_executor.model_loader._default_methods",
    )  # fmt: skip
    backend = Backend(
        {n: getattr(init, n) for n in names},
        config_model._get_transformers_backend_cls,
        loader.track_weights_loading,
        methods,
        up.AutoWeightsLoader,
    )
    _LOADED[id(up)] = backend
    return backend


class _Logits(nn.Module):
    def __init__(self, *_: Any, **__: Any) -> None:
        super().__init__()


def sys_module(name: str) -> types.ModuleType:
    import sys

    return sys.modules[name]
