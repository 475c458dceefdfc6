"""``AutoWeightsLoader``: recursive loading by the module tree, as vLLM 0.34.0 walks it.

The stream is walked by the first name component. Runs of consecutive names with the same first
component form a group; a child module with its own ``load_weights`` receives its group with the
prefix stripped, anything else recurses down to parameters. Internally each item carries its
ledger entry so every checkpoint name ends up accounted for.

What is not loaded, since vLLM 0.29.0 (PR #53106): a name a mapper rule maps to ``None`` (the
caller's mapper, merged with ``REMOVE_UNUSED_ROTARY_EMBEDS_MAPPER``, which drops the rotary
buffers some checkpoints carry), and an alias of a tied word embedding (``lm_head.weight`` when
it is ``model.embed_tokens.weight``), skipped automatically. The ``skip_prefixes`` /
``skip_substrs`` lists of vLLM 0.28.0 and before live with bug 2's story
(``loadkit.models.plamo2.skips.AutoWeightsLoaderWithSkips``).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from loadkit.errors import (
    NestedWeightError,
    UnknownNameError,
)
from loadkit.loading.ledger import CheckpointEntry, LoadLedger, remember
from loadkit.loading.observe import LoadObserver
from loadkit.loading.tensors import loadable_tensors, qualname, tied_embedding_aliases
from loadkit.loading.weight_loaders import load_param, set_weight_attrs, weight_source
from loadkit.mapper import WeightsMapper, rule_text
from loadkit.terms import Status

BIAS_RULE = "upstream's '.bias' suffix rule"
ROTARY_RULE = "AutoWeightsLoader's rotary mapper"

ROTARY_EMBEDS_UNUSED_WEIGHTS = (
    "rotary_pos_emb.inv_freq",
    "rotary_emb.inv_freq",
    "rotary_emb.cos_cached",
    "rotary_emb.sin_cached",
)

Item = tuple[str, torch.Tensor, CheckpointEntry]


class AutoWeightsLoader:
    """Loads a checkpoint stream into ``module`` by walking its module tree.

    Args:
        module: the root module.
        ignore_unexpected_prefixes: a name the module does not have is ignored, not an error,
            when it starts with one of these...
        ignore_unexpected_suffixes: ...or ends with one of these (``".bias"`` always is).
        observer: a ``loadkit.loading.observe.LoadObserver`` that follows the load (``None``: the
            one of the enclosing ``observing`` scope, if any).

    A weight is not loaded when the mapper drops it (a rule mapping to ``None``; the rotary
    buffers always are) or when it names an alias of a tied word embedding (``aliased_params``).
    The caller's lists are copied, never changed. After ``load_weights``, ``self.ledger``
    accounts for every checkpoint name and every model tensor.

    >>> from loadkit import WeightsMapper
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False))
    >>> loader = AutoWeightsLoader(model)
    >>> drop_head = WeightsMapper(orig_to_new_prefix={"lm_head.": None})
    >>> weights = [("0.weight", torch.eye(2)), ("lm_head.weight", torch.eye(2))]
    >>> loader.load_weights(weights, mapper=drop_head)
    {'0.weight'}
    >>> [(e.name, e.status, e.rule) for e in loader.ledger.entries]
    [('0.weight', 'loaded', None), ('lm_head.weight', 'dropped by mapper', "prefix 'lm_head.'")]
    """

    # Checkpoints trained with early ColossalAI or quantised by GPTQModel carry these buffers.
    REMOVE_UNUSED_ROTARY_EMBEDS_MAPPER = WeightsMapper(
        orig_to_new_substr=dict.fromkeys(ROTARY_EMBEDS_UNUSED_WEIGHTS)
    )

    def __init__(
        self,
        module: nn.Module,
        *,
        ignore_unexpected_prefixes: list[str] | None = None,
        ignore_unexpected_suffixes: list[str] | None = None,
        observer: LoadObserver | None = None,
    ) -> None:
        self.module = module
        self.observer = observer  # None: the scope's (loadkit.loading.observe.observing)
        # Copies: upstream extends the caller's lists in place, which leaks rules between models.
        self.ignore_unexpected_prefixes = list(ignore_unexpected_prefixes or [])
        self.ignore_unexpected_suffixes = list(ignore_unexpected_suffixes or [])
        # Two names of one tied embedding would write one storage twice: the first name
        # reached in module order loads, the others are skipped.
        self.aliased_params = tied_embedding_aliases(module)
        self.ledger: LoadLedger | None = None

    # --- rules ---

    def _skip_rule(self, qualname: str) -> str | None:
        """Why ``qualname`` (a weight's full name, or a parameter's) is skipped, if it is."""
        first = self.aliased_params.get(qualname)
        return None if first is None else f"tied embedding: an alias of {first!r}"

    def _skip_module_rule(self, qualname: str) -> str | None:
        """Why a whole group under ``qualname`` is skipped: never, since vLLM 0.29.0 (the
        aliases are parameter names)."""
        return None

    def _builtin_mapper(self, mapper: WeightsMapper | None) -> WeightsMapper:
        """The caller's mapper with the loader's own rules: upstream merges the rotary mapper
        into every load (after a quantisation config's, which loadkit has not)."""
        return (mapper or WeightsMapper()) | self.REMOVE_UNUSED_ROTARY_EMBEDS_MAPPER

    def _ignore_rule(self, qualname: str) -> str | None:
        for p in self.ignore_unexpected_prefixes:
            if qualname.startswith(p):
                return f"ignore_unexpected_prefixes {p!r}"
        for s in self.ignore_unexpected_suffixes:
            if qualname.endswith(s):
                return f"ignore_unexpected_suffixes {s!r}"
        # Upstream appends ".bias" to the ignore suffixes on every load (GPTQ checkpoints carry
        # biases their models lack); loadkit keeps the caller's list and applies it here.
        if qualname.endswith(".bias"):
            return BIAS_RULE
        return None

    # --- the walk ---

    def _entries(
        self, weights: Iterable[tuple[str, torch.Tensor]], mapper: WeightsMapper, own: set
    ) -> Iterator[Item]:
        """Each weight with its ledger entry, mapped (``own``: the loader's built-in rules, for
        the ledger's word on who dropped a name)."""
        ledger = self.ledger
        assert ledger is not None
        for transform in mapper.weights_transforms:
            weights = transform(weights)
        for name, tensor in weights:
            entry = ledger.add(name, tensor)
            trace = mapper.trace(name)
            if trace.result is None:
                step = trace.dropped_by
                entry.status = Status.MAPPER_DROPPED
                entry.rule = rule_text(step.stage, step.rule) if step else "mapper"
                if step and (step.stage, step.rule) in own:
                    entry.rule = f"{entry.rule} ({ROTARY_RULE})"
                continue
            yield from self._shards(trace.result, tensor, trace.shard_id, entry)

    def _shards(self, name: str, tensor: torch.Tensor, shard_id: Any, entry: CheckpointEntry):
        """The mapped weight, once per shard id (a list loads one tensor into several), each
        past the skip rules."""
        ledger = self.ledger
        assert ledger is not None
        shard_ids = shard_id if isinstance(shard_id, list) else [shard_id]
        for i, one_id in enumerate(shard_ids):
            one = tensor if i == 0 else tensor.detach()  # the same storage, its own shard_id
            if one_id is not None:
                set_weight_attrs(one, {"shard_id": one_id})
            entry.mapped = name
            rule = self._skip_rule(name)
            if not rule and ledger.observer is not None:
                rule = ledger.observer.skipped(self, entry)
            if rule:
                entry.status, entry.rule = Status.SKIPPED, rule
                continue
            yield name, one, entry

    @staticmethod
    def _groupby_prefix(items: Iterable[Item]) -> Iterator[tuple[str, Iterator[Item]]]:
        split = ((name.split(".", 1), tensor, entry) for name, tensor, entry in items)
        for head, group in itertools.groupby(split, key=lambda x: x[0][0]):
            yield head, ((p[1] if len(p) == 2 else "", t, e) for p, t, e in group)

    @staticmethod
    def _mark(group: Iterable[Item], status: Status, rule: str) -> None:
        for _, _, entry in group:
            entry.status, entry.rule = status, rule

    def _candidates(self) -> Iterator[str]:
        for name, _ in self.module.named_modules():
            if name:
                yield name
        yield from (self.ledger.params if self.ledger else ())

    def _unexpected(self, qual: str, entries: list[CheckpointEntry], reason: str) -> bool:
        """Ask the observer whether ``qual`` may be recorded instead of raised (a dry load)."""
        ledger = self.ledger
        observer = ledger.observer if ledger is not None else None
        if (
            observer is None
            or ledger is None
            or not observer.unexpected(ledger, qual, entries, reason)
        ):
            return False
        for entry in entries:
            entry.status, entry.rule = Status.UNEXPECTED, reason
        return True

    def _delegate(self, prefix: str, items: Iterable[Item]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor, entry in items:
            entry.status, entry.target = Status.DELEGATED, prefix
            yield name, tensor

    @staticmethod
    def _left_by(prefix: str, items: Iterable[Item]) -> Iterator[Item]:
        for item in items:
            item[2].left_by = prefix
            yield item

    def _load_param(self, prefix: str, param: torch.Tensor, group: Iterable[Item]) -> Iterator[str]:
        assert self.ledger is not None
        for rest, tensor, entry in group:
            qual = qualname(prefix, rest)
            rule = self._skip_rule(qual)
            if rule:
                entry.status, entry.rule = Status.SKIPPED, rule
                continue
            if rest:
                rule = self._ignore_rule(qual)
                if rule:
                    entry.status, entry.rule = Status.IGNORED, rule
                    continue
                reason = f"nested under the parameter '{prefix}'"
                if self._unexpected(qual, [entry], reason):
                    continue
                raise NestedWeightError(qual, prefix, weight_source(entry.name, tensor))
            load_param(param, tensor, name=prefix, source=weight_source(entry.name, tensor))
            entry.status, entry.target = Status.LOADED, prefix
            self.ledger.param_loaded(prefix, source=entry.name)
            yield prefix

    def _load_module(self, prefix: str, module: nn.Module, items: Iterable[Item]) -> Iterator[str]:
        assert self.ledger is not None
        if module is not self.module:  # the root's load_weights is usually what called us
            own = getattr(module, "load_weights", None)
            if callable(own):
                items = iter(items)  # one iterator: what the child does not pull stays in it
                loaded = own(self._delegate(prefix, items))
                if loaded is None:
                    warnings.warn(
                        f"{type(module).__name__}.load_weights at '{prefix}' returned None; "
                        "its parameters cannot be accounted for",
                        stacklevel=2,
                    )
                else:
                    for name in loaded:
                        qual = qualname(prefix, name)
                        self.ledger.param_loaded(qual, via=prefix)
                        yield qual
                # As upstream, the walk goes on: what the child left of its group (a loader
                # that stopped early) is loaded by the generic rules below, or raises.
                items = self._left_by(prefix, items)

        children = dict(module.named_children())
        tensors = loadable_tensors(module, recurse=False)
        for head, group in self._groupby_prefix(items):
            qual = qualname(prefix, head)
            if head in children:
                rule = self._skip_module_rule(qual)
                if rule:
                    self._mark(group, Status.SKIPPED, rule)
                    continue
                yield from self._load_module(qual, children[head], group)
            elif head in tensors:
                rule = self._skip_rule(qual)
                if rule:
                    self._mark(group, Status.SKIPPED, rule)
                    continue
                yield from self._load_param(qual, tensors[head], group)
            else:
                rule = self._skip_module_rule(qual) or self._skip_rule(qual)
                if rule:
                    self._mark(group, Status.SKIPPED, rule)
                    continue
                rule = self._ignore_rule(qual + ".") or self._ignore_rule(qual)
                if rule:
                    self._mark(group, Status.IGNORED, rule)
                    continue
                _, tensor, entry = next(group)
                if self.ledger.observer is not None:  # a dry load: record the group, go on
                    root = type(self.module).__name__
                    reason = f"no module or parameter named '{qual}' in {root}"
                    if self._unexpected(qual, [entry, *(e for _, _, e in group)], reason):
                        continue
                raise UnknownNameError(
                    qual,
                    type(self.module).__name__,
                    self._candidates(),
                    weight_source(entry.name, tensor),
                )

    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        *,
        mapper: WeightsMapper | None = None,
    ) -> set[str]:
        """Load ``weights``; return the qualified names loaded. ``self.ledger`` tells the rest.

        Inside ``loadkit.loading.observe.observing(obs)`` (or with ``observer=obs``), ``obs`` sees
        the ledger, may replace ``mapper``, and may take unknown names instead of an error.

        Args:
            weights: ``(checkpoint name, tensor)`` pairs, read lazily.
            mapper: maps each name first (``WeightsMapper.apply``), if given; merged with
                ``REMOVE_UNUSED_ROTARY_EMBEDS_MAPPER``.

        Returns:
            The fully qualified names loaded (never the skipped or ignored ones). A name the
            model does not have raises ``UnknownNameError`` with the nearest existing names.

        >>> from loadkit import WeightsMapper
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False))
        >>> mapper = WeightsMapper(orig_to_new_prefix={"model.": ""})
        >>> AutoWeightsLoader(model).load_weights([("model.0.weight", torch.eye(2))], mapper=mapper)
        {'0.weight'}
        """
        self.ledger = LoadLedger(self.module, self.observer)
        remember(self.module, self.ledger)
        if self.ledger.observer is not None:
            mapper = self.ledger.observer.loading(self, mapper)
        own = {(stage, rule) for stage, rule, _ in self._builtin_mapper(None).rules()}
        own -= {(stage, rule) for stage, rule, _ in (mapper.rules() if mapper else ())}
        items = self._entries(weights, self._builtin_mapper(mapper), own)
        return set(self._load_module("", self.module, items))
