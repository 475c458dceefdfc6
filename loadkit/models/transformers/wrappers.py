"""The wrapper classes and how one is picked (upstream: ``transformers/__init__.py`` and
``ModelConfig._get_transformers_backend_cls``).

Upstream picks by the suffix of ``config.architectures[0]`` (``_SUFFIX_TO_DEFAULTS``): an
architecture whose default runner is "pooling" gets ``TransformersEmbeddingModel`` (task "embed")
or ``TransformersForSequenceClassification`` (task "classify"); everything else
``TransformersForCausalLM``. Its multimodal and mixture-of-experts variants are not
re-implemented here (their layers change the names): such configs are refused unless a wrapper is
named explicitly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from loadkit.errors import ModelSpecError
from loadkit.models.transformers.base import Base
from loadkit.models.transformers.causal import CausalMixin
from loadkit.models.transformers.legacy import LegacyMixin
from loadkit.models.transformers.pooling import EmbeddingMixin, SequenceClassificationMixin

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class TransformersForCausalLM(CausalMixin, Base):
    """A generative transformers model: ``model`` and ``lm_head``.

    >>> from transformers import LlamaConfig
    >>> cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...                   num_attention_heads=2, vocab_size=64)
    >>> m = TransformersForCausalLM(cfg, device="meta")
    >>> tuple(m.lm_head.weight.shape), m.hf_to_vllm_mapper.map_name("model.norm.weight")
    ((64, 16), 'model.norm.weight')
    """


class TransformersEmbeddingModel(EmbeddingMixin, LegacyMixin, Base):
    """An encoder used for embeddings: ``model`` alone, with the legacy drop rules.

    >>> from transformers import BertConfig
    >>> cfg = BertConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...                  num_attention_heads=2, vocab_size=64)
    >>> m = TransformersEmbeddingModel(cfg, device="meta")
    >>> drop = m.hf_to_vllm_mapper.map_name
    >>> type(m.model).__name__, drop("embeddings.position_ids"), drop("score.bias")
    ('BertModel', None, None)
    """


class TransformersForSequenceClassification(SequenceClassificationMixin, LegacyMixin, Base):
    """An encoder with transformers' classification head as ``classifier``.

    >>> from transformers import BertConfig
    >>> cfg = BertConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...                  num_attention_heads=2, vocab_size=64, num_labels=3)
    >>> m = TransformersForSequenceClassification(cfg, device="meta")
    >>> tuple(m.classifier.weight.shape)
    (3, 16)
    """


WRAPPERS: dict[str, type[Base]] = {
    "causal": TransformersForCausalLM,
    "embed": TransformersEmbeddingModel,
    "classify": TransformersForSequenceClassification,
}

# Upstream's architecture suffixes -> (runner, task), first match wins (vllm/config/model.py).
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

# Upstream's get_num_experts looks at these, in this order.
NUM_EXPERTS_NAMES = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")


class Choice(NamedTuple):
    """The wrapper picked for a config, and why (the inspect report says both)."""

    wrapper: type[Base]
    reason: str


def num_experts(config: PretrainedConfig) -> int:
    text = config.get_text_config()
    for name in NUM_EXPERTS_NAMES:
        value = getattr(text, name, None)
        if value is not None:
            return int(value[0] if isinstance(value, list) else value)
    return 0


def choose_wrapper(config: PretrainedConfig, task: str | None = None) -> Choice:
    """Upstream's choice of wrapper for ``config``; ``task`` ("causal", "embed", "classify")
    overrides it.

    >>> from transformers import BertConfig
    >>> choose_wrapper(BertConfig(architectures=["BertModel"])).wrapper.__name__
    'TransformersEmbeddingModel'
    """
    if task is not None:
        if task not in WRAPPERS:
            raise ModelSpecError(f"unknown wrapper {task!r}; choose from {', '.join(WRAPPERS)}")
        return Choice(WRAPPERS[task], f"asked for ({task})")
    if config.get_text_config() is not config:
        raise ModelSpecError(
            f"{config.model_type!r} is multimodal: vLLM uses its TransformersMultiModal* "
            "wrappers, which loadkit does not re-implement; name a wrapper (--model "
            "hf-causal, hf-embed, hf-classify) to check the names with a text-only one"
        )
    if num_experts(config) > 0:
        raise ModelSpecError(
            f"{config.model_type!r} is a mixture of experts: vLLM uses its TransformersMoE* "
            "wrappers, whose fused expert layers loadkit does not re-implement; name a wrapper "
            "(--model hf-causal, hf-embed, hf-classify) to check the names with a dense one"
        )
    architectures = list(getattr(config, "architectures", None) or [])
    if not architectures:
        return Choice(
            TransformersForCausalLM,
            "the config names no architecture: the generative wrapper, as upstream's default",
        )
    arch = architectures[0]
    for suffix, (runner, convert) in SUFFIX_TO_DEFAULTS:
        if arch.endswith(suffix):
            if runner == "pooling" and convert == "embed":
                return Choice(TransformersEmbeddingModel, f"{arch!r} ends in {suffix!r}: embed")
            if runner == "pooling" and convert == "classify":
                return Choice(
                    TransformersForSequenceClassification, f"{arch!r} ends in {suffix!r}: classify"
                )
            return Choice(TransformersForCausalLM, f"{arch!r} ends in {suffix!r}: generate")
    return Choice(
        TransformersForCausalLM, f"{arch!r} has no known suffix: generate, as upstream's default"
    )
