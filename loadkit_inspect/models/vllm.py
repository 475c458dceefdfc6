"""Which class vLLM 0.34.0 would serve a Hugging Face config with, and why.

vLLM's ``ModelRegistry.resolve_model_cls`` with ``model_impl="auto"`` (its default), read from
the wheel (``vllm/model_executor/models/registry.py``) and re-stated over the registry's table
(``loadkit_inspect.models.vllm_registry``):

1. when no entry of ``config.architectures`` is registered and the first one's suffix asks for
   no conversion (a generative model), the Transformers modeling backend, if transformers has
   the class and it can run vLLM's attention (``is_backend_compatible`` or
   ``_can_set_attn_implementation``);
2. else the first architecture registered, directly or after swapping its suffix for another
   (``LlamaForSequenceClassification`` is ``LlamaForCausalLM`` turned into a classifier by vLLM's
   pooling adapter): vLLM's own class, or the Transformers backend class the registry names;
3. else the Transformers backend, as in 1, whatever the suffix;
4. else vLLM refuses: an architecture it served until some version, one an out-of-tree plugin
   serves, or one it does not know.

``model_impl="transformers"`` asks for the backend (vLLM's ``--model-impl transformers``);
``"vllm"`` for vLLM's own class only. Which wrapper the backend uses follows
``ModelConfig._get_transformers_backend_cls``: ``MultiModal`` for a nested config, ``MoE`` for
experts, then by the architecture's suffix ``ForCausalLM``, ``EmbeddingModel`` or
``ForSequenceClassification``.

>>> from transformers import LlamaConfig
>>> resolve(LlamaConfig(architectures=["LlamaForCausalLM"])).label
'vllm 0.34.0, native LlamaForCausalLM'
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, NamedTuple

from loadkit.errors import ModelSpecError
from loadkit_inspect.models.vllm_registry import (
    MODELS,
    OUT_OF_TREE,
    PREVIOUSLY_SUPPORTED,
    VERSION,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

MODEL_IMPLS = ("auto", "vllm", "transformers")
TRANSFORMERS_MODULE = "transformers"  # the registry's module name for the backend's classes

# vLLM's _SUFFIX_TO_DEFAULTS (vllm/config/model.py): suffix -> (runner, convert), first match wins.
SUFFIX_TO_DEFAULTS: tuple[tuple[str, tuple[str, str]], ...] = (
    ("ForCausalLM", ("generate", "none")),
    ("ForConditionalGeneration", ("generate", "none")),
    ("ChatModel", ("generate", "none")),
    ("LMHeadModel", ("generate", "none")),
    ("ForTextEncoding", ("pooling", "embed")),
    ("EmbeddingModel", ("pooling", "embed")),
    ("ForSequenceClassification", ("pooling", "classify")),
    ("ForTokenClassification", ("pooling", "classify")),
    ("ForAudioClassification", ("pooling", "classify")),
    ("ForImageClassification", ("pooling", "classify")),
    ("ForVideoClassification", ("pooling", "classify")),
    ("ClassificationModel", ("pooling", "classify")),
    ("ForRewardModeling", ("pooling", "embed")),
    ("RewardModel", ("pooling", "embed")),
    ("Model", ("pooling", "embed")),  # last: other `*Model`s take priority
)

# vLLM's get_num_experts looks these up on the text config, in this order.
NUM_EXPERTS_NAMES = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")


class VllmClass(NamedTuple):
    """The class vLLM 0.34.0 would build for a config, and why (``None``: it refuses)."""

    name: str | None
    architecture: str | None  # the entry of config.architectures it came from
    native: bool  # vLLM's own class, not the Transformers modeling backend
    why: str
    refusal: str | None = None  # vLLM's ValueError, when it refuses
    adapter: str | None = None  # "classify" or "embed": vLLM's pooling adapter wraps the class

    @property
    def version(self) -> str:
        """The vLLM release whose registry made the choice."""
        return VERSION

    @property
    def via(self) -> str | None:
        """The class, as a verdict names it: ``native Qwen3MoeForCausalLM``,
        ``TransformersForCausalLM``, ``native LlamaForCausalLM as classify (pooling adapter)``;
        ``None`` when vLLM refuses."""
        if self.name is None:
            return None
        kind = "native " if self.native else ""
        adapted = f" as {self.adapter} (pooling adapter)" if self.adapter else ""
        return f"{kind}{self.name}{adapted}"

    @property
    def label(self) -> str:
        """How the report names the loader: ``vllm 0.34.0, native Qwen3MoeForCausalLM``."""
        return f"vllm {VERSION}, {self.via}" if self.via else f"vllm {VERSION}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "class": self.name,
            "architecture": self.architecture,
            "native": self.native,
            "adapter": self.adapter,
            "why": self.why,
            "refusal": self.refusal,
        }


def suffix_defaults(architecture: str) -> tuple[str, tuple[str, str]] | None:
    """``(suffix, (runner, convert))`` of the first suffix ``architecture`` ends with.

    >>> suffix_defaults("BertForSequenceClassification")
    ('ForSequenceClassification', ('pooling', 'classify'))
    """
    for suffix, defaults in SUFFIX_TO_DEFAULTS:
        if architecture.endswith(suffix):
            return suffix, defaults
    return None


def num_experts(config: PretrainedConfig) -> int:
    """The experts per MoE layer, as vLLM reads them from the text config (0: dense)."""
    text = config.get_text_config()
    for name in NUM_EXPERTS_NAMES:
        value = getattr(text, name, None)
        if value:
            return int(value[0] if isinstance(value, list) else value)
    return 0


def backend_class(config: PretrainedConfig, runner: str | None = None) -> str:
    """The Transformers backend's wrapper for ``config`` (vLLM's
    ``ModelConfig._get_transformers_backend_cls``).

    >>> from transformers import BertConfig
    >>> backend_class(BertConfig(architectures=["BertModel"]))
    'TransformersEmbeddingModel'
    """
    cls = "Transformers"
    cls += "MultiModal" if config.get_text_config() is not config else ""
    cls += "MoE" if num_experts(config) > 0 else ""
    architectures = list(getattr(config, "architectures", None) or [])
    defaults = suffix_defaults(architectures[0]) if architectures else None
    runner_type, task = defaults[1] if defaults else (None, None)
    runner_type = runner or runner_type
    if runner_type == "pooling" and task == "embed":
        return cls + "EmbeddingModel"
    if runner_type == "pooling" and task == "classify":
        return cls + "ForSequenceClassification"
    return cls + "ForCausalLM"


def _transformers_fallback(config: PretrainedConfig, architecture: str) -> str | None:
    """The backend's class when transformers can serve ``architecture`` to vLLM, else ``None``
    (vLLM's ``_try_resolve_transformers`` under ``model_impl="auto"``; remote code aside:
    loadkit never runs it)."""
    if architecture in MODELS and MODELS[architecture][0] == TRANSFORMERS_MODULE:
        if architecture.startswith("Transformers"):
            return architecture
    cls = transformers_class(architecture)
    if cls is None or not hasattr(cls, "is_backend_compatible"):
        return None
    can_set = getattr(cls, "_can_set_attn_implementation", lambda: False)
    if not (cls.is_backend_compatible() or can_set()):
        return None
    return backend_class(config)


def _normalize(architecture: str) -> str:
    """``architecture`` as registered, or with its suffix swapped for one that is (vLLM's
    ``_normalize_arch``)."""
    if architecture in MODELS:
        return architecture
    match = suffix_defaults(architecture)
    if match:
        for repl, _ in SUFFIX_TO_DEFAULTS:
            base = architecture.replace(match[0], repl)
            if base in MODELS:
                return base
    return architecture


def _convert_type(architectures: list[str]) -> str:
    """vLLM's default ``convert_type`` for architectures none of which is registered."""
    for arch in architectures:
        match = suffix_defaults(arch)
        if match:
            return match[1][1]
    return "none"


def _registered(architecture: str, normalized: str, why: str) -> VllmClass:
    module, cls = MODELS[normalized]
    native = module != TRANSFORMERS_MODULE
    adapter = None
    if normalized != architecture:
        match = suffix_defaults(architecture)
        convert = match[1][1] if match else "none"
        adapter = None if convert == "none" else convert
        why = f"{architecture!r} is not registered; {normalized!r} is, {why}"
    return VllmClass(cls, architecture, native, why, adapter=adapter)


def _backend(config: PretrainedConfig, architecture: str, cls: str, why: str) -> VllmClass:
    return VllmClass(cls, architecture, False, why)


def refusal(architectures: list[str]) -> str:
    """vLLM's ``ValueError`` for architectures it cannot serve (``_raise_for_unsupported``)."""
    for arch in architectures:
        if arch in PREVIOUSLY_SUPPORTED:
            return (
                f"Model architecture {arch} was supported in vLLM until "
                f"v{PREVIOUSLY_SUPPORTED[arch]}, and is not supported anymore"
            )
        if arch in OUT_OF_TREE:
            return (
                f"Model architecture {arch} is not supported in-tree anymore: it needs the "
                f"plugin at {OUT_OF_TREE[arch]}"
            )
    return f"Model architectures {architectures} are not supported for now"


def resolve(config: PretrainedConfig, model_impl: str = "auto") -> VllmClass:
    """The class vLLM 0.34.0 would build for ``config`` under ``model_impl``."""
    if model_impl not in MODEL_IMPLS:
        raise ModelSpecError(f"--model-impl {model_impl!r}: choose from {', '.join(MODEL_IMPLS)}")
    architectures = list(getattr(config, "architectures", None) or [])
    if not architectures:
        return VllmClass(None, None, False, "the config names no architecture",
                         refusal="No model architectures are specified")  # fmt: skip
    first = architectures[0]
    if model_impl == "transformers":
        cls = _transformers_fallback(config, first)
        if cls is None:
            why = f"transformers has no {first!r} that vLLM's Transformers backend can run"
            return VllmClass(None, first, False, why, refusal=why)
        return _backend(config, first, cls, "--model-impl transformers")
    unregistered = all(a not in MODELS for a in architectures)
    if model_impl == "auto" and unregistered and _convert_type(architectures) == "none":
        cls = _transformers_fallback(config, first)
        if cls is not None:
            why = f"{first!r} is not in vLLM's registry: it falls back to the Transformers backend"
            return _backend(config, first, cls, why)
    for arch in architectures:
        normalized = _normalize(arch)
        if normalized in MODELS:
            module = MODELS[normalized][0]
            why = (
                "registered for the Transformers backend"
                if module == TRANSFORMERS_MODULE
                else f"registered in vllm/model_executor/models/{module}.py"
                if not module.startswith("vllm.")
                else f"registered in {module}"
            )
            return _registered(arch, normalized, why)
    if model_impl == "auto" and unregistered:
        cls = _transformers_fallback(config, first)
        if cls is not None:
            why = f"{first!r} is not in vLLM's registry: it falls back to the Transformers backend"
            return _backend(config, first, cls, why)
    if getattr(config, "auto_map", None):
        why = "the config's auto_map names remote code for it, which loadkit never runs"
        return VllmClass(f"remote code for {first}", first, False, why)
    message = refusal(architectures)
    return VllmClass(None, first, False, f"vLLM refuses {first}", refusal=message)


def transformers_class(architecture: str) -> type | None:
    """The installed transformers' class named ``architecture``, or ``None`` (its lazy module
    raises ``ValueError`` for some names it does not have)."""
    import transformers

    try:
        found = getattr(transformers, architecture, None)
    except (AttributeError, ImportError, ValueError):
        return None
    return found if isinstance(found, type) else None


def known_to_transformers(architecture: str) -> bool:
    """Does the installed transformers have a model class named ``architecture``?"""
    return transformers_class(architecture) is not None


def nearest_known(architecture: str, n: int = 3) -> list[str]:
    """The architectures vLLM 0.34.0 or transformers knows that are spelled most like
    ``architecture``."""
    from transformers.models.auto import modeling_auto

    names = set(MODELS)
    for name, table in vars(modeling_auto).items():  # the plain name tables, not the lazy ones
        if name.endswith("_MAPPING_NAMES") and isinstance(table, dict):
            names.update(v for v in table.values() if isinstance(v, str))
    return difflib.get_close_matches(architecture, sorted(names), n=n, cutoff=0.5)
