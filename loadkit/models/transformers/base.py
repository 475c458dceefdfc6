"""``Base``: any transformers model as a loadkit model, as vLLM's Transformers backend does it.

Re-implements the loading half of vLLM 0.34.0's ``vllm/model_executor/models/transformers/
base.py``: transformers builds the model (``AutoModel.from_config``) as ``self.model``, and
``_create_hf_to_vllm_mapper`` derives the ``hf_to_vllm_mapper`` from transformers' own weight
renamings (the model's, and since 0.34.0 those registered for a class in ``architectures`` that
``AutoModel`` did not build), its ignore list and its base-model prefix; ``load_weights`` is an
``AutoWeightsLoader`` over the wrapper with that mapper. What upstream does for serving (tensor-
and pipeline-parallel layer replacement, attention instances, torch.compile) is left out: it
changes no name. Tensor parallelism is ``loadkit.parallel``'s concern.

Where loadkit differs from upstream, on purpose:

- the caller's config is copied, not patched in place;
- on ``device="meta"`` (the header-only inspector) parameters and buffers are all on meta;
  otherwise transformers builds the model on that device with its own initialisation, so
  buffers hold real values (upstream keeps buffers off meta by patching ``nn.Module``);
- materialising a meta parameter keeps tied parameters tied (upstream replaces each one);
- the ignore patterns are added in sorted order (a Python ``set`` upstream: any order; every
  one of them drops, so the result is the same).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from itertools import chain
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.mapper import WeightsMapper, renaming_label

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

# Where each kind of rule in the derived mapper comes from (the inspect report shows these).
FROM_TRANSFORMERS = "from transformers"
DERIVED = "derived from the transformers model"


def config_dtype(config: PretrainedConfig) -> torch.dtype:
    """The dtype the checkpoint was saved in (``config.dtype``), float32 when it says none."""
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


class Base(nn.Module):
    """A transformers model in ``self.model``, loaded the vLLM way.

    >>> from transformers import LlamaConfig
    >>> cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...                   num_attention_heads=2, vocab_size=64)
    >>> m = Base(cfg, device="meta")
    >>> type(m.model).__name__, m.hf_to_vllm_mapper.map_name("layers.0.mlp.up_proj.weight")
    ('LlamaModel', 'model.layers.0.mlp.up_proj.weight')
    """

    embedding_modules = ["embed_tokens"]  # noqa: RUF012 (upstream's class attribute)

    def __init__(
        self,
        config: PretrainedConfig,
        *,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__()
        self.config = copy.deepcopy(config)
        self.text_config = self.config.get_text_config()
        self.model_dtype = dtype or config_dtype(self.config)
        self.device_ = torch.device(device)

        # Attributes for weight loading (see load_weights); mixins extend them.
        self.ignore_unexpected_prefixes: list[str] = []
        self.ignore_unexpected_suffixes: list[str] = []
        # (stage, rule text) -> where the rule comes from, for the inspect report.
        self.mapper_rule_origins: dict[tuple[str, str], str] = {}
        # Set by the builders that read a config.json: its path and why this wrapper.
        self.config_source: str | None = None
        self.wrapper_reason: str | None = None

        self._patch_config()
        # On meta nothing is allocated and transformers skips its initialisation (it only ties).
        with torch.device(self.device_):
            self.model: PreTrainedModel = self._auto_model_class().from_config(
                **self._from_config_kwargs()
            )
        self._create_hf_to_vllm_mapper()
        self._replace_vocab_embeddings()
        self.init_parameters(self.model)
        self.keep_in_fp32(self.model)

    # --- building ---

    def _patch_config(self) -> None:
        # Upstream also sets the attention implementation to its own kernels ("vllm"): that
        # changes how the model runs, not its names, and loadkit has no such kernels.
        self.config.dtype = self.model_dtype

    @staticmethod
    def _auto_model_class() -> Any:
        from transformers import AutoModel

        return AutoModel

    def _from_config_kwargs(self) -> dict[str, Any]:
        # Remote code is never run: a local folder's Python would execute on inspection.
        return {"config": self.config, "dtype": self.model_dtype, "trust_remote_code": False}

    def _create_hf_to_vllm_mapper(self) -> None:
        """Derive ``hf_to_vllm_mapper`` as upstream does, from transformers' own metadata.

        - transformers' weight renamings (``WeightRenaming`` entries of
          ``_weight_conversions``), as the renaming stage;
        - each pattern of ``_keys_to_ignore_on_load_unexpected``: a regex that drops the key;
        - a checkpoint saved under another base-model prefix: ``^{bmp}\\.(.+)`` -> ``model.\\1``;
        - saved without the prefix (the name starts with a direct child of ``self.model``):
          ``model.`` + name;
        - saved with a ``model.`` prefix that is no child: the rest;
        - an ``lm_head`` saved inside the base model: ``lm_head...``.

        Each rule's origin is noted in ``mapper_rule_origins`` (the inspect report shows it).
        """
        renaming = self._renamings()
        regex: dict[str | re.Pattern[str], str | None] = {}
        self._ignore_rules(regex)
        self._prefix_rules(regex)
        self.hf_to_vllm_mapper = WeightsMapper(
            orig_to_new_renaming=renaming, orig_to_new_regex=regex
        )

    def _renamings(self) -> list[Any]:
        """The ``WeightRenaming`` entries of ``_weight_conversions`` (``WeightConverter``
        entries, merging experts or splitting qkv, are not handled upstream either: a TODO
        there), each noted with where transformers registers it."""
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        cls = type(self.model).__name__
        origins = self.mapper_rule_origins
        legacy = {renaming_label(r) for r in get_checkpoint_conversion_mapping("legacy") or ()}
        built = {type(m).__name__ for m in self.model.modules()}
        for arch in getattr(self.config, "architectures", None) or []:
            for m in get_checkpoint_conversion_mapping(arch) or () if arch not in built else ():
                origins.setdefault(
                    ("renaming", renaming_label(m)),
                    f"{FROM_TRANSFORMERS}: get_checkpoint_conversion_mapping({arch!r}) (a class "
                    "AutoModel did not build)",
                )
        renaming = [m for m in self._weight_conversions() if isinstance(m, WeightRenaming)]
        for mapping in renaming:
            label = renaming_label(mapping)
            kind = "legacy renamings" if label in legacy else f"{cls}'s conversion mapping"
            origins.setdefault(
                ("renaming", label), f"{FROM_TRANSFORMERS}: get_model_conversion_mapping ({kind})"
            )
        return renaming

    def _add_rule(
        self,
        regex: dict[str | re.Pattern[str], str | None],
        pattern: str,
        target: str | None,
        origin: str,
    ) -> None:
        rx = re.compile(pattern)
        regex[rx] = target
        self.mapper_rule_origins[("regex", rx.pattern)] = origin

    def _ignore_rules(self, regex: dict[str | re.Pattern[str], str | None]) -> None:
        """A rule dropping each pattern of ``_keys_to_ignore_on_load_unexpected``."""
        model = self.model
        origin = f"{FROM_TRANSFORMERS}: {type(model).__name__}._keys_to_ignore_on_load_unexpected"
        for key in sorted(model._keys_to_ignore_on_load_unexpected or ()):
            self._add_rule(regex, key, None, origin)

    def _prefix_rules(self, regex: dict[str | re.Pattern[str], str | None]) -> None:
        """The rules that standardise the base-model prefix, and a nested ``lm_head``'s."""
        model = self.model
        cls = type(model).__name__
        bmp = model.base_model_prefix
        expected_bmp = r"model.\1"
        if bmp and bmp != "model":
            origin = f"{DERIVED}: a checkpoint saved under its base_model_prefix {bmp!r}"
            self._add_rule(regex, rf"^{bmp}\.(.+)", expected_bmp, origin)
        direct_children = chain(
            model.named_children(),
            model.named_parameters(recurse=False),
            model.named_buffers(recurse=False),
        )
        children = "|".join(name for name, _ in direct_children)
        origin = (
            f"{DERIVED}: a checkpoint saved without the base-model prefix (a direct child of {cls})"
        )
        self._add_rule(regex, rf"^(?!model\.)(({children}).*)", expected_bmp, origin)
        origin = f"{DERIVED}: a 'model.' prefix on a name that is no child of {cls}"
        self._add_rule(regex, rf"^(model\.)((?!{children}).+)", r"\2", origin)
        origin = "vLLM's rule: an lm_head saved inside the base model"
        self._add_rule(regex, r"^model\.(.+\.)*(lm_head.+)", r"\2", origin)

    def _weight_conversions(self) -> list[Any]:
        """transformers' weight conversions for ``self.model``, and (vLLM 0.34.0) those
        registered for each class of ``config.architectures`` that ``AutoModel`` did not build
        (a head's renaming, such as GPT-NeoX's ``embed_out`` -> ``lm_head``)."""
        from transformers.conversion_mapping import (
            get_checkpoint_conversion_mapping,
            get_model_conversion_mapping,
        )

        mappings = list(get_model_conversion_mapping(self.model))
        built = {type(m).__name__ for m in self.model.modules()}
        for arch in getattr(self.config, "architectures", None) or []:
            if arch not in built:
                mappings.extend(get_checkpoint_conversion_mapping(arch) or [])
        return mappings

    def _vocab_embeddings(self) -> list[nn.Embedding]:
        """The ``nn.Embedding``s of ``self.model`` that hold a vocabulary (vLLM 0.34.0): those of
        the input embedding, and any whose size is one of the config's ``*vocab_size*``."""
        from transformers import PretrainedConfig

        def vocab_sizes(config: Any) -> Iterable[int]:
            for key, value in vars(config).items():
                if isinstance(value, PretrainedConfig):
                    yield from vocab_sizes(value)
                elif "vocab_size" in key and isinstance(value, int):
                    yield value

        sizes = set(vocab_sizes(self.config))
        found = [
            m for m in self.model.get_input_embeddings().modules() if isinstance(m, nn.Embedding)
        ]
        found += [
            m
            for m in self.model.modules()
            if isinstance(m, nn.Embedding) and m.num_embeddings in sizes
        ]
        return list({id(m): m for m in found}.values())

    def _replace_vocab_embeddings(self) -> None:
        """What upstream's ``recursive_replace`` does to the names: each vocabulary embedding it
        reaches (children first, a replaced module not entered) gets a weight of its own, as
        its ``VocabParallelEmbedding`` replacement has; a module reached twice keeps the first.
        So two modules that shared one table (an encoder's and a decoder's ``embed_tokens`` and
        ``shared``) no longer do: each is a parameter a load must fill (docs/fidelity.md)."""
        vocab = {id(m) for m in self._vocab_embeddings()}
        done: set[int] = set()

        def walk(module: nn.Module) -> None:
            for child in module.children():
                if id(child) not in vocab:
                    walk(child)
                elif id(child) not in done:
                    done.add(id(child))
                    w = cast(torch.Tensor, child.weight)  # an nn.Embedding's
                    device = w.device if w.device.type == "meta" else self.device_
                    child.weight = nn.Parameter(torch.empty_like(w, device=device))

        walk(self.model)

    def _get_tie_word_embeddings(self) -> bool:
        # transformers v4 kept this on the text config, v5 on the top-level one.
        return bool(
            getattr(self.text_config, "tie_word_embeddings", False)
            or getattr(self.config, "tie_word_embeddings", False)
        )

    def init_parameters(self, module: nn.Module, dtype: torch.dtype | None = None) -> None:
        """Give every parameter still on meta real (uninitialised) storage on ``self.device_``.

        A no-op on the meta device. Tied parameters stay tied (one new tensor per old one).
        """
        if self.device_.type == "meta":
            return
        dtype = dtype or self.model_dtype
        made: dict[int, nn.Parameter] = {}
        for sub in module.modules():
            for name, param in list(sub.named_parameters(recurse=False)):
                if param.device.type != "meta" or hasattr(param, "weight_loader"):
                    continue
                if id(param) not in made:
                    data = torch.empty_like(param.data, dtype=dtype, device=self.device_)
                    made[id(param)] = nn.Parameter(data, requires_grad=param.requires_grad)
                setattr(sub, name, made[id(param)])

    def keep_in_fp32(self, module: nn.Module) -> None:
        """Honour ``_keep_in_fp32_modules_strict`` as ``from_pretrained`` would (half dtypes)."""
        if self.model_dtype not in (torch.float16, torch.bfloat16):
            return
        fragments = getattr(module, "_keep_in_fp32_modules_strict", None)
        if not fragments:
            return
        pattern = re.compile("|".join(re.escape(f) for f in fragments))
        for name, tensor in chain(module.named_parameters(), module.named_buffers()):
            if not hasattr(tensor, "weight_loader") and pattern.search(name):
                tensor.data = tensor.data.to(torch.float32)

    # --- loading ---

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loader = AutoWeightsLoader(
            self,
            ignore_unexpected_prefixes=self.ignore_unexpected_prefixes,
            ignore_unexpected_suffixes=self.ignore_unexpected_suffixes,
        )
        return loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)

    # --- for reports ---

    def backend_info(self) -> dict[str, Any]:
        """What was built and why: the inspect report's ``model.backend`` section."""
        import transformers

        return {
            "wrapper": type(self).__name__,
            "transformers_class": type(self.model).__name__,
            "model_type": self.config.model_type,
            "architectures": list(getattr(self.config, "architectures", None) or []),
            "base_model_prefix": self.model.base_model_prefix,
            "tie_word_embeddings": self._get_tie_word_embeddings(),
            "transformers_version": transformers.__version__,
            "config": getattr(self, "config_source", None),
            "wrapper_reason": getattr(self, "wrapper_reason", None),
        }
