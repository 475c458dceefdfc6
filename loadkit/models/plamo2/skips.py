"""``AutoWeightsLoaderWithSkips``: ``AutoWeightsLoader`` as vLLM had it through 0.28.0, with the
``skip_prefixes`` and ``skip_substrs`` lists Plamo2's loader used (bug 2).

Plamo2 left vLLM after 0.26.0 (PR #49729). Its ``Plamo2ForCausalLM.load_weights`` handed
everything to ``AutoWeightsLoader(self, skip_prefixes=["lm_head."])`` when the embeddings were
tied. vLLM 0.29.0 removed both lists (PR #53106): a skip is now a mapper rule to ``None``, and a
tied embedding's alias is skipped without being asked (``loadkit.AutoWeightsLoader``). The story
of bug 2 is told in the code that shipped, so that code keeps its loader here. Its rules are
vLLM 0.28.0's, checked against that wheel by ``make test-upstream``: a name (after the mapper)
starting with a prefix or holding a substring is skipped, as is a whole module group whose path
plus ``"."`` does; the rotary buffers are skip substrings, not a mapper; no alias is skipped.
"""

from __future__ import annotations

from torch import nn

from loadkit.loading.auto_loader import ROTARY_EMBEDS_UNUSED_WEIGHTS, AutoWeightsLoader
from loadkit.loading.observe import LoadObserver
from loadkit.mapper import WeightsMapper


class AutoWeightsLoaderWithSkips(AutoWeightsLoader):
    """vLLM 0.28.0's ``AutoWeightsLoader`` (and 0.26.0's, Plamo2's last): ``skip_prefixes`` and
    ``skip_substrs`` beside the ignore lists.

    Args:
        module: the root module.
        skip_prefixes: names (after the mapper) starting with one of these are skipped.
        skip_substrs: names containing one of these are skipped (the rotary buffers always are).
        ignore_unexpected_prefixes, ignore_unexpected_suffixes, observer: as
            ``AutoWeightsLoader``'s.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False))
    >>> loader = AutoWeightsLoaderWithSkips(model, skip_prefixes=["lm_head."])
    >>> loader.load_weights([("0.weight", torch.eye(2)), ("lm_head.weight", torch.eye(2))])
    {'0.weight'}
    >>> [(e.name, e.status, e.rule) for e in loader.ledger.entries]
    [('0.weight', 'loaded', None), ('lm_head.weight', 'skipped', "skip_prefixes 'lm_head.'")]
    """

    ROTARY_EMBEDS_UNUSED_WEIGHTS = ROTARY_EMBEDS_UNUSED_WEIGHTS

    def __init__(
        self,
        module: nn.Module,
        *,
        skip_prefixes: list[str] | None = None,
        skip_substrs: list[str] | None = None,
        ignore_unexpected_prefixes: list[str] | None = None,
        ignore_unexpected_suffixes: list[str] | None = None,
        observer: LoadObserver | None = None,
    ) -> None:
        super().__init__(
            module,
            ignore_unexpected_prefixes=ignore_unexpected_prefixes,
            ignore_unexpected_suffixes=ignore_unexpected_suffixes,
            observer=observer,
        )
        # Copies: upstream extends the caller's lists in place (docs/fidelity.md).
        self.skip_prefixes = list(skip_prefixes or [])
        self.skip_substrs = list(skip_substrs or []) + list(ROTARY_EMBEDS_UNUSED_WEIGHTS)
        self.aliased_params = {}  # before 0.29.0 no alias was skipped unasked

    def _skip_rule(self, qualname: str) -> str | None:
        for p in self.skip_prefixes:
            if qualname.startswith(p):
                return f"skip_prefixes {p!r}"
        for s in self.skip_substrs:
            if s in qualname:
                kind = (
                    "rotary, always skipped"
                    if s in ROTARY_EMBEDS_UNUSED_WEIGHTS
                    else "skip_substrs"
                )
                return f"{kind} {s!r}"
        return None

    def _skip_module_rule(self, qualname: str) -> str | None:
        return self._skip_rule(qualname + ".")

    def _builtin_mapper(self, mapper: WeightsMapper | None) -> WeightsMapper:
        return mapper or WeightsMapper()  # the rotary buffers are skip_substrs here
