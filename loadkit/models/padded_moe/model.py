"""The padded mixture-of-experts modules: a router and ``FusedMoE`` experts per layer.

``FusedMoE`` holds every expert's gate and up projections in one ``w13_weight`` of shape
``[experts, 2 * intermediate_padded, hidden]`` (gate rows first, up rows from
``intermediate_padded``) and the down projections in ``w2_weight`` ``[experts, hidden,
intermediate_padded]``, as vLLM 0.34.0's unquantized MoE method creates them. Its
``weight_loader`` writes a checkpoint tensor into its expert's slice, narrowed to the checkpoint's
rows (vLLM's ``_load_w13``, ``_load_w2``, ``_narrow_expert_data_for_padding``): the padding is never
written. ``weight_loader_numel`` says how many elements a checkpoint fills (vLLM 0.31.0), and
``padding_fill_params()`` which parameters a direct reload zero-fills (0.34.0).

The forward runs the experts at their padded size, as a kernel does: a padded row of
``w13_weight`` feeds a padded column of ``w2_weight``, so the padding only cancels out when it
reads zero.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from loadkit.errors import ShapeMismatchError
from loadkit.loading.weight_loaders import load_param, loader_of, set_weight_attrs, weight_source
from loadkit.models._common import RMSNorm
from loadkit.models.padded_moe.config import PaddedMoeConfig

# (param suffix, checkpoint projection, shard id), as vLLM's make_expert_params_mapping.
EXPERT_PROJECTIONS: tuple[tuple[str, str, str], ...] = (
    ("w13_weight", "gate_proj", "w1"),
    ("w13_weight", "up_proj", "w3"),
    ("w2_weight", "down_proj", "w2"),
)


class FusedMoE(nn.Module):
    """Every expert of one layer in two padded parameters (see the module doc)."""

    def __init__(self, c: PaddedMoeConfig) -> None:
        super().__init__()
        self.c = c
        e, h, i, ip = c.num_experts, c.hidden_size, c.intermediate_size, c.intermediate_padded
        # Zeros: a fresh load leaves the padding as vLLM's kernels need it (vLLM zeroes it in
        # the conversions of the backends that pad: _zero_intermediate_padding).
        self.w13_weight = nn.Parameter(torch.zeros(e, 2 * ip, h, dtype=c.torch_dtype), False)
        self.w2_weight = nn.Parameter(torch.zeros(e, h, ip, dtype=c.torch_dtype), False)
        set_weight_attrs(
            self.w13_weight,
            {"weight_loader": self.weight_loader, "weight_loader_numel": e * 2 * i * h},
        )
        set_weight_attrs(
            self.w2_weight, {"weight_loader": self.weight_loader, "weight_loader_numel": e * h * i}
        )

    def padding_fill_params(self) -> list[str]:
        """Parameters a direct reload zero-fills whole: the padded ones (vLLM 0.34.0)."""
        padded = self.c.intermediate_padded > self.c.intermediate_size
        return ["w13_weight", "w2_weight"] if padded else []

    def weight_loader(
        self,
        param: torch.Tensor,
        loaded_weight: torch.Tensor,
        weight_name: str,
        shard_id: str,
        expert_id: int,
    ) -> None:
        """Copy one expert's projection into its slice of ``param``, checkpoint rows only."""
        ip = self.c.intermediate_padded
        target = param.data[expert_id]
        if shard_id != "w2":
            target = target.narrow(0, 0 if shard_id == "w1" else ip, ip)
        # vLLM's _narrow_expert_data_for_padding: each dimension larger than the checkpoint's is
        # narrowed to it, so the padding stays (and a tensor up to the padded size fits).
        for dim, n in enumerate(loaded_weight.shape[: target.dim()]):
            if target.shape[dim] > n:
                target = target.narrow(dim, 0, n)
        if tuple(target.shape) != tuple(loaded_weight.shape):
            raise ShapeMismatchError(tuple(target.shape), tuple(loaded_weight.shape))
        target.copy_(loaded_weight)

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
    ) -> torch.Tensor:
        """``x`` [tokens, hidden] through each token's chosen ``experts`` [tokens, k], summed
        with their routing ``weights`` [tokens, k]."""
        ip = self.c.intermediate_padded
        out = torch.zeros_like(x)
        for k in range(experts.shape[1]):
            for e in experts[:, k].unique().tolist():
                rows = experts[:, k] == e
                gate_up = x[rows] @ self.w13_weight[e].T
                act = F.silu(gate_up[:, :ip]) * gate_up[:, ip:]
                out[rows] += weights[rows, k, None] * (act @ self.w2_weight[e].T)
        return out


class PaddedMoeBlock(nn.Module):
    """A norm, a router (``gate``) and the experts, with a residual connection."""

    def __init__(self, c: PaddedMoeConfig) -> None:
        super().__init__()
        self.c = c
        self.input_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps, dtype=c.torch_dtype)
        self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=False, dtype=c.torch_dtype)
        self.experts = FusedMoE(c)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.input_layernorm(h)
        probs = torch.softmax(self.gate(x), dim=-1)
        weights, experts = probs.topk(self.c.num_experts_per_tok, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)  # renormalised, as Mixtral's
        return h + self.experts(x, weights, experts)


class PaddedMoeModel(nn.Module):
    def __init__(self, c: PaddedMoeConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, dtype=c.torch_dtype)
        self.layers = nn.ModuleList(PaddedMoeBlock(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps, dtype=c.torch_dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class PaddedMoeForCausalLM(nn.Module):
    """The model; ``load_weights`` takes Mixtral-style checkpoint names, each expert apart
    (``model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight``, the router as
    ``mlp.gate.weight``).

    >>> from loadkit.models.padded_moe import make_checkpoint
    >>> model = PaddedMoeForCausalLM()
    >>> ckpt = make_checkpoint(model.config, seed=0)
    >>> len(ckpt), len(model.load_weights(ckpt.items()))  # 24 expert tensors into 4 weights
    (31, 11)
    >>> model.model.layers[0].experts.w13_weight[:, 12:16].abs().sum().item()  # padding
    0.0
    """

    def __init__(self, config: PaddedMoeConfig | None = None) -> None:
        super().__init__()
        self.config = config or PaddedMoeConfig()
        c = self.config
        self.model = PaddedMoeModel(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False, dtype=c.torch_dtype)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[tokens, vocab]`` for one sequence of token ids."""
        return self.lm_head(self.model(input_ids))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load checkpoint tensors, the experts through ``FusedMoE.weight_loader``; return the
        parameter names loaded (as vLLM's native loops: one name per parameter)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            target = name.replace(".mlp.gate.", ".gate.").replace(".mlp.experts.", ".experts.")
            expert = _expert_target(target)
            if expert is None:
                param = params[target]
                load_param(param, tensor, name=target, source=weight_source(name, tensor))
                loaded.add(target)
                continue
            pname, expert_id, projection, shard_id = expert
            param = params[pname]
            loader_of(param)(param, tensor, projection, shard_id, expert_id)
            loaded.add(pname)
        return loaded


def _expert_target(name: str) -> tuple[str, int, str, str] | None:
    """(parameter, expert id, projection, shard id) of an expert checkpoint name, else None.

    >>> _expert_target("model.layers.1.experts.3.up_proj.weight")
    ('model.layers.1.experts.w13_weight', 3, 'up_proj', 'w3')
    """
    head, sep, rest = name.partition(".experts.")
    if not sep:
        return None
    expert, _, leaf = rest.partition(".")
    for param, projection, shard_id in EXPERT_PROJECTIONS:
        if leaf == f"{projection}.weight":
            return f"{head}.experts.{param}", int(expert), projection, shard_id
    return None
