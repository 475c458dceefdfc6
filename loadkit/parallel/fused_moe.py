"""vLLM 0.34.0's fused mixture-of-experts layer, its loading half (``layers/fused_moe``).

``FusedMoE(...)`` (vLLM's ``FusedMoEFactory``) builds a ``MoERunner`` whose ``routed_experts``
(``RoutedExperts``) holds every expert of a layer in two parameters:

- ``w13_weight [experts, 2 * intermediate / tp, hidden]``: each expert's gate projection (shard
  ``w1``) over its up projection (``w3``), both column-parallel;
- ``w2_weight [experts, hidden, intermediate / tp]``: the down projections (``w2``),
  row-parallel; ``w13_bias`` and ``w2_bias`` when the experts have biases (gpt-oss).

A checkpoint reaches them through the expert mapping (``build_expert_params_mapping``): per-expert
tensors (``experts.3.gate_proj.weight``, Mixtral's ``experts.3.w1.weight``) and fused ones
(``experts.gate_up_proj [experts, 2 * intermediate, hidden]``, ``experts.down_proj``), which
vLLM tells apart by rank (a 3-d tensor is all experts at once). ``RoutedExperts.load_weights``
is upstream's, re-stated: the first mapping entry whose checkpoint name the key contains wins.

What vLLM does not track, loadkit records: which (expert, shard) slices each load filled, so
``pop_missing_experts`` can name an expert the checkpoint lacks (vLLM leaves it uninitialised
without a word, ``loadkit.loading.track``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from loadkit.errors import ShapeMismatchError, UnknownNameError
from loadkit.loading.tensors import named_parameters, submodules
from loadkit.parallel.quant import UnquantizedFusedMoEMethod
from loadkit.parallel.state import TensorParallelError, divide, get_tp_group

ExpertMapping = list[tuple[str, str, int, str]]  # (param_name, weight_name, expert_id, shard_id)
SHARD_ID_TO_SHARDED_DIM = {"w1": 0, "w2": 1, "w3": 0}


@dataclass
class FusedMoEConfig:
    """The sizes a ``RoutedExperts`` is built from (vLLM's ``FusedMoEConfig``, one rank's view;
    no expert parallelism, no redundant experts)."""

    num_experts: int  # physical experts (logical plus redundant)
    num_logical_experts: int
    experts_per_token: int
    hidden_dim: int
    intermediate_size: int
    intermediate_size_per_partition: int
    is_act_and_mul: bool
    has_bias: bool
    tp_size: int
    tp_rank: int
    tp_shard_with_padding: bool = False

    @property
    def num_local_experts(self) -> int:
        return self.num_experts


class ExpertMapManager:
    """Global to local expert ids: the identity without expert parallelism (vLLM's
    ``ExpertMapManager`` on one expert-parallel rank)."""

    num_fused_shared_experts = 0

    def __init__(self, num_experts: int) -> None:
        self.local_num_experts = num_experts

    def map_global_to_local(self, expert_id: int) -> int:
        return expert_id


def build_expert_params_mapping(
    ckpt_gate_proj_name: str,
    ckpt_down_proj_name: str,
    ckpt_up_proj_name: str | None,
    num_experts: int,
    num_redundant_experts: int = 0,
    routed_experts_prefix: str = "routed_experts",
    lora_base_layer_prefix: str = "",
    lora_base_layer_prefix_on_param_name: str = "",
    include_fused: bool = False,
    is_gated: bool = True,
) -> ExpertMapping:
    """``(param_name, weight_name, expert_id, shard_id)`` for every expert weight a checkpoint
    may hold: the fused entries first (``include_fused``), then per expert ``w1``, ``w2``,
    ``w3`` (vLLM's ``RoutedExperts.build_expert_params_mapping``).

    >>> build_expert_params_mapping("gate_proj", "down_proj", "up_proj", 1)[:2]
    [('experts.routed_experts.w13_', 'experts.0.gate_proj.', 0, 'w1'), \
('experts.routed_experts.w2_', 'experts.0.down_proj.', 0, 'w2')]
    """
    physical_to_logical = list(range(num_experts))
    physical_to_logical += [i % num_experts for i in range(num_redundant_experts)]
    if routed_experts_prefix:
        routed_experts_prefix = f"{routed_experts_prefix}."
    w13 = f"experts.{lora_base_layer_prefix_on_param_name}{routed_experts_prefix}w13_"
    w2 = f"experts.{lora_base_layer_prefix_on_param_name}{routed_experts_prefix}w2_"
    fused = _fused_mapping(
        w13, w2, ckpt_gate_proj_name, ckpt_down_proj_name, ckpt_up_proj_name, is_gated,
        physical_to_logical, lora_base_layer_prefix,
    ) if include_fused else []  # fmt: skip
    per_expert = [
        (
            w13 if weight_name in (ckpt_gate_proj_name, ckpt_up_proj_name) else w2,
            f"experts.{physical_to_logical[e]}.{weight_name}.{lora_base_layer_prefix}",
            e,
            shard_id,
        )
        for e in range(len(physical_to_logical))
        for shard_id, weight_name in (
            ("w1", ckpt_gate_proj_name),
            ("w2", ckpt_down_proj_name),
            ("w3", ckpt_up_proj_name),
        )
        if weight_name is not None
    ]
    return fused + per_expert


def _fused_mapping(
    w13: str,
    w2: str,
    gate: str,
    down: str,
    up: str | None,
    is_gated: bool,
    physical_to_logical: list[int],
    lora_prefix: str,
) -> ExpertMapping:
    """The entries for checkpoints that hold every expert in one tensor (``experts.gate_up_proj``,
    ``experts.down_proj``), and per-expert fused ``gate_up_proj`` tensors."""
    shards: tuple[str, ...] = ("w1", "w3")
    if not is_gated:
        gate_up: str | None = gate
        shards = ("w1",)
    elif (gate, up) == ("gate_proj", "up_proj"):
        gate_up = "gate_up_proj"
    elif (gate, up) == ("w1", "w3"):
        gate_up = "w13"
    else:  # vLLM logs a warning and leaves the fused entries out
        return []
    out: ExpertMapping = [
        (f"{w13}weight", f"experts.{gate_up}", chunk, shard) for chunk, shard in enumerate(shards)
    ]
    out.append((f"{w2}weight", f"experts.{down}", 0, "w2"))
    if is_gated:
        out += [
            (w13, f"experts.{physical_to_logical[e]}.{gate_up}.{lora_prefix}", e, shard)
            for e in range(len(physical_to_logical))
            for shard in ("w1", "w3")
        ]
    return out


def index_expert_mapping(mapping: ExpertMapping) -> dict[str, ExpertMapping]:
    """The mapping by logical expert id (``"3"``), entry order kept; ``{}`` when an entry's
    checkpoint name is not ``experts.<id>...`` (then every key scans the whole mapping)."""
    by_expert: dict[str, ExpertMapping] = {}
    for entry in mapping:
        prefix, _, suffix = entry[1].partition(".")
        key, sep, _ = suffix.partition(".")
        if prefix != "experts" or not key or (key.isdecimal() and not sep):
            return {}
        if key.isdecimal():
            by_expert.setdefault(key, []).append(entry)
    return by_expert


class ExpertLookup:
    """The entries of an expert mapping whose checkpoint name a key contains, in the mapping's
    order: exactly what a hand-written loader's ``if weight_name not in name: continue`` leaves
    (vLLM's DeepSeek loop), found without trying all of them (768 at 256 experts, for every key).

    Every checkpoint name starts with the names' common prefix (``experts.``): a name occurs in
    a key only where that prefix does, as the key's slice of the name's length there. Without a
    common prefix each key tries every entry, as upstream does.

    >>> lookup = ExpertLookup(build_expert_params_mapping("gate_proj", "down_proj", "up_proj", 12))
    >>> [e[1:] for e in lookup.matching("mlp.experts.1.up_proj.weight")]
    [('experts.1.up_proj.', 1, 'w3')]
    >>> lookup.matching("mlp.shared_experts.gate_proj.weight")
    []
    """

    def __init__(self, mapping: ExpertMapping) -> None:
        self.mapping = mapping
        names = [weight_name for _, weight_name, _, _ in mapping]
        # character by character, as wanted here (not path components: RUF071's concern)
        self.anchor = os.path.commonprefix(names)  # noqa: RUF071
        self.lengths = sorted({len(n) for n in names})
        self.where: dict[str, list[int]] = {}
        for i, n in enumerate(names):
            self.where.setdefault(n, []).append(i)

    def matching(self, key: str) -> ExpertMapping:
        """The entries whose checkpoint name ``key`` contains, in the mapping's order (the
        class's example)."""
        if not self.anchor:
            return [entry for entry in self.mapping if entry[1] in key]
        hits: set[int] = set()
        at = key.find(self.anchor)
        while at >= 0:
            for n in self.lengths:
                hits.update(self.where.get(key[at : at + n], ()))
            at = key.find(self.anchor, at + 1)
        return [self.mapping[i] for i in sorted(hits)]


class RoutedExperts(nn.Module):
    """Every expert of one layer in ``w13_weight`` and ``w2_weight`` (and biases), with vLLM's
    expert-aware ``weight_loader`` and ``load_weights``."""

    def __init__(
        self,
        layer_name: str,
        params_dtype: torch.dtype | None,
        moe_config: FusedMoEConfig,
        *,
        ckpt_gate_proj_name: str = "gate_proj",
        ckpt_down_proj_name: str = "down_proj",
        ckpt_up_proj_name: str | None = "up_proj",
        is_fused_checkpoint_transposed: bool = False,
    ) -> None:
        super().__init__()
        self.layer_name = layer_name
        self.moe_config = moe_config
        self.quant_config = None
        self.ckpt_gate_proj_name = ckpt_gate_proj_name
        self.ckpt_down_proj_name = ckpt_down_proj_name
        self.ckpt_up_proj_name = ckpt_up_proj_name
        self.is_fused_checkpoint_transposed = is_fused_checkpoint_transposed
        self.expert_map_manager = ExpertMapManager(moe_config.num_experts)
        self.global_num_experts = moe_config.num_experts
        self.local_num_experts = moe_config.num_local_experts
        self.quant_method = UnquantizedFusedMoEMethod()
        self.shared_expert_online_loader = None
        self.lora_base_layer_prefix = ""
        self._loaded_expert_biases: set[str] = set()
        # loadkit's record: parameter -> (expert, shard) slices a load filled.
        self.loaded_experts: dict[str, set[tuple[int, str]]] = {}
        self._create_weights(params_dtype)

    def _create_weights(self, dtype: torch.dtype | None) -> None:
        c = self.moe_config
        experts, hidden, inter = (
            c.num_local_experts,
            c.hidden_dim,
            c.intermediate_size_per_partition,
        )
        up = 2 * inter if c.is_act_and_mul else inter
        shapes: dict[str, tuple[int, ...]] = {
            "w13_weight": (experts, up, hidden),
            "w2_weight": (experts, hidden, inter),
        }
        if c.has_bias:
            shapes.update(w13_bias=(experts, up), w2_bias=(experts, hidden))
        for name in ("w13_weight", "w13_bias", "w2_weight", "w2_bias"):
            if name in shapes:
                param = nn.Parameter(torch.zeros(shapes[name], dtype=dtype), requires_grad=False)
                param.weight_loader = self.weight_loader  # type: ignore[attr-defined]
                self.register_parameter(name, param)

    # --- the expert-aware loader of one checkpoint tensor ---

    def weight_loader(
        self,
        param: nn.Parameter,
        loaded_weight: torch.Tensor,
        weight_name: str,
        shard_id: str,
        expert_id: int,
        return_success: bool = False,
    ) -> bool | None:
        """Load one expert's shard (or, for a 3-d tensor, every expert's) into ``param``."""
        limit = self.moe_config.num_experts + self.expert_map_manager.num_fused_shared_experts
        if not expert_id < limit:  # vLLM asserts
            raise TensorParallelError(
                f"Expert id {expert_id} is out of range for {self.layer_name}; expected < {limit}"
            )
        expert_id = self.expert_map_manager.map_global_to_local(expert_id)
        if shard_id not in SHARD_ID_TO_SHARDED_DIM:
            raise ValueError(f"shard_id must be ['w1','w2','w3'] but got {shard_id}.")
        shard_dim = SHARD_ID_TO_SHARDED_DIM[shard_id]
        full_load = loaded_weight.ndim == 3
        if full_load:
            shard_dim += 1
        expert_data = param.data if full_load else param.data[expert_id]
        self._record(param, expert_id, shard_id, full_load)
        if "bias" in weight_name:
            self._loaded_expert_biases.add(weight_name.rsplit(".", 1)[-1])
            if shard_id == "w2":
                expert_data = narrow_for_padding(expert_data, loaded_weight, (0,))
                copy_weight(expert_data, loaded_weight)
            else:
                self._load_w13(expert_data, 0, shard_id, loaded_weight)
            return True if return_success else None
        if "weight" in weight_name:
            if shard_id == "w2":
                self._load_w2(expert_data, shard_dim, loaded_weight)
            else:
                self._load_w13(expert_data, shard_dim, shard_id, loaded_weight)
            return True if return_success else None
        return False if return_success else None

    def _record(self, param: nn.Parameter, expert_id: int, shard_id: str, full: bool) -> None:
        name = next((n for n, p in self.named_parameters() if p is param), None)
        if name is None:
            return
        experts = range(self.moe_config.num_local_experts) if full else (expert_id,)
        self.loaded_experts.setdefault(name, set()).update((e, shard_id) for e in experts)

    def _tp_slice(self, loaded_weight: torch.Tensor, shard_dim: int) -> torch.Tensor | None:
        """This rank's share of ``loaded_weight`` along ``shard_dim`` (``None``: none left)."""
        if loaded_weight.ndim == 0:
            return loaded_weight
        tp = self.moe_config.tp_size
        per_rank = loaded_weight.shape[shard_dim] // tp
        start = per_rank * self.moe_config.tp_rank
        available = loaded_weight.shape[shard_dim] - start
        if available <= 0:
            return None
        return loaded_weight.narrow(shard_dim, start, min(per_rank, available))

    def _load_w13(
        self, expert_data: torch.Tensor, shard_dim: int, shard_id: str, loaded: torch.Tensor
    ) -> None:
        size = expert_data.shape[shard_dim] // (2 if self.moe_config.is_act_and_mul else 1)
        sliced = self._tp_slice(loaded, shard_dim)
        if sliced is None:
            return
        expert_data = expert_data.narrow(shard_dim, 0 if shard_id == "w1" else size, size)
        hidden = hidden_dim(shard_dim, expert_data.ndim)
        copy_weight(narrow_for_padding(expert_data, sliced, (hidden, shard_dim)), sliced)

    def _load_w2(self, expert_data: torch.Tensor, shard_dim: int, loaded: torch.Tensor) -> None:
        sliced = self._tp_slice(loaded, shard_dim)
        if sliced is None:
            return
        hidden = hidden_dim(shard_dim, expert_data.ndim)
        copy_weight(narrow_for_padding(expert_data, sliced, (hidden, shard_dim)), sliced)

    # --- the layer's own load_weights (the mapping, as upstream walks it) ---

    def get_expert_mapping(self, include_fused: bool = False) -> ExpertMapping:
        c = self.moe_config
        return build_expert_params_mapping(
            self.ckpt_gate_proj_name,
            self.ckpt_down_proj_name,
            self.ckpt_up_proj_name,
            num_experts=c.num_logical_experts + self.expert_map_manager.num_fused_shared_experts,
            num_redundant_experts=c.num_experts - c.num_logical_experts,
            routed_experts_prefix="",
            lora_base_layer_prefix=self.lora_base_layer_prefix,
            include_fused=include_fused,
            is_gated=c.is_act_and_mul,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[str]:
        """Each key (relative to the layer) to the expert slices it names, as vLLM 0.34.0's
        ``RoutedExperts.load_weights``: the names of the parameters loaded, once per slice."""
        mapping = self.get_expert_mapping(include_fused=True)
        by_expert = index_expert_mapping(mapping)
        for expert_name, loaded_weight in weights:
            qual = f"{self.layer_name}.{expert_name}"
            named = None
            if qual.count("experts.") == 1:
                named = by_expert.get(qual.partition("experts.")[2].partition(".")[0])
            is_fused = loaded_weight.ndim == 3 and named is None
            candidates = mapping if is_fused or qual.count("experts.") != 1 else named or mapping
            yield from self._load_one(qual, loaded_weight, candidates, is_fused)

    def _load_one(
        self, qual: str, loaded_weight: torch.Tensor, candidates: ExpertMapping, is_fused: bool
    ) -> Iterator[str]:
        matched = False
        for param_name, weight_name, expert_id, shard_id in candidates:
            if weight_name not in qual:
                if matched and is_fused:
                    break  # fused tensors use the first contiguous run of matches
                continue
            matched = True
            per_expert_fused_w13 = (
                not is_fused
                and shard_id in ("w1", "w3")
                and any(f".{n}." in qual for n in ("gate_up_proj", "w13"))
            )
            mapped = qual.replace(weight_name, param_name)
            name = mapped.removeprefix(f"{self.layer_name}.")
            param = getattr(self, name, None)
            if param is None:
                if name.endswith(("w13_bias", "w2_bias")):
                    continue
                raise UnknownNameError(qual, type(self).__name__, dict(self.named_parameters()))
            for expert, part in self._slices(
                loaded_weight, expert_id, shard_id, is_fused, per_expert_fused_w13
            ):
                ok = param.weight_loader(
                    param=param,
                    loaded_weight=part,
                    weight_name=mapped,
                    shard_id=shard_id,
                    expert_id=expert,
                    return_success=True,
                )
                if ok:
                    yield name

    def _slices(
        self, weight: torch.Tensor, expert_id: int, shard_id: str, fused: bool, fused_w13: bool
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """``(expert, tensor)`` for each expert a checkpoint tensor holds."""
        if fused:
            if self.is_fused_checkpoint_transposed:
                weight = weight.transpose(-1, -2)
            if shard_id in ("w1", "w3") and self.moe_config.is_act_and_mul:
                weight = weight.chunk(2, dim=1)[expert_id]  # expert_id: which half (w1, w3)
            yield from enumerate(weight.unbind())
        elif fused_w13:
            yield expert_id, weight.chunk(2, dim=0)[0 if shard_id == "w1" else 1]
        else:
            yield expert_id, weight

    def pop_missing_experts(self) -> list[str]:
        """``"<param>[expert E, wN]"`` for each slice a load left out of a parameter it loaded
        something into; the record is then forgotten."""
        loaded, self.loaded_experts = self.loaded_experts, {}
        shards: dict[str, tuple[str, ...]] = {"w13_weight": ("w1", "w3"), "w13_bias": ("w1", "w3")}
        if not self.moe_config.is_act_and_mul:
            shards = {"w13_weight": ("w1",), "w13_bias": ("w1",)}
        out = []
        for name, got in loaded.items():
            for e in range(self.moe_config.num_local_experts):
                for shard in shards.get(name, ("w2",)):
                    if (e, shard) not in got:
                        out.append(f"{name}[expert {e}, {shard}]")
        return out


def hidden_dim(shard_dim: int, ndim: int) -> int:
    """The hidden dimension of an expert tensor, given its sharded one (vLLM's
    ``_get_hidden_dim``): the other of its last two dimensions."""
    if ndim < 2:
        return 0
    return ndim - 1 if shard_dim == ndim - 2 else ndim - 2


def narrow_for_padding(
    expert_data: torch.Tensor, loaded_weight: torch.Tensor, dims: tuple[int, ...]
) -> torch.Tensor:
    """``expert_data`` narrowed to ``loaded_weight``'s size along ``dims`` where it is larger
    (vLLM's ``_narrow_expert_data_for_padding``: a checkpoint tensor smaller than the parameter
    fills its leading part, without an error)."""
    if loaded_weight.ndim == 0:
        return expert_data
    for dim in dims:
        if (
            0 <= dim < expert_data.ndim
            and dim < loaded_weight.ndim
            and expert_data.shape[dim] > loaded_weight.shape[dim]
        ):
            expert_data = expert_data.narrow(dim, 0, loaded_weight.shape[dim])
    return expert_data


def copy_weight(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``, as vLLM's ``copy_weight_`` (a shape that does not broadcast raises)."""
    if tuple(dst.shape) != tuple(src.shape):
        try:
            torch.broadcast_shapes(tuple(src.shape), tuple(dst.shape))
        except RuntimeError:
            raise ShapeMismatchError(tuple(dst.shape), tuple(src.shape)) from None
        if torch.broadcast_shapes(tuple(src.shape), tuple(dst.shape)) != tuple(dst.shape):
            raise ShapeMismatchError(tuple(dst.shape), tuple(src.shape))
    dst.copy_(src)


class MoERunner(nn.Module):
    """The layer the model holds as ``experts``: its ``routed_experts``, and the gate and shared
    experts it was handed (registered here too, as upstream does; one parameter, two names)."""

    def __init__(
        self,
        layer_name: str,
        routed_experts: RoutedExperts,
        *,
        gate: nn.Module | None = None,
        shared_experts: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.layer_name = layer_name
        self.moe_config = routed_experts.moe_config
        self.gate = gate
        self.routed_experts = routed_experts
        self.shared_experts = shared_experts

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[str]:
        for name in self.routed_experts.load_weights(weights):
            yield f"routed_experts.{name}"


def FusedMoE(
    num_experts: int,
    top_k: int,
    hidden_size: int,
    intermediate_size: int,
    *,
    params_dtype: torch.dtype | None = None,
    prefix: str = "",
    activation: str = "silu",
    has_bias: bool = False,
    ckpt_names: tuple[str, str, str | None] = ("gate_proj", "down_proj", "up_proj"),
    is_fused_checkpoint_transposed: bool = False,
    gate: nn.Module | None = None,
    shared_experts: nn.Module | None = None,
    routed_experts_cls: type[RoutedExperts] | None = None,
) -> MoERunner:
    """The ``MoERunner`` of ``num_experts`` experts for this rank of the current group: each
    expert's intermediate size is split across the ranks (vLLM's tensor-parallel MoE).

    >>> runner = FusedMoE(4, 2, 8, 6, prefix="model.layers.0.mlp.experts")
    >>> tuple(runner.routed_experts.w13_weight.shape), tuple(runner.routed_experts.w2_weight.shape)
    ((4, 12, 8), (4, 8, 6))
    """
    group = get_tp_group()
    per_rank = divide(intermediate_size, group.world_size, f"{prefix}: expert intermediate size")
    config = FusedMoEConfig(
        num_experts=num_experts,
        num_logical_experts=num_experts,
        experts_per_token=top_k,
        hidden_dim=hidden_size,
        intermediate_size=intermediate_size,
        intermediate_size_per_partition=per_rank,
        is_act_and_mul=activation in ("silu", "swigluoai", "gelu"),
        has_bias=has_bias,
        tp_size=group.world_size,
        tp_rank=group.rank,
    )
    experts = (routed_experts_cls or RoutedExperts)(
        prefix,
        params_dtype,
        config,
        ckpt_gate_proj_name=ckpt_names[0],
        ckpt_down_proj_name=ckpt_names[1],
        ckpt_up_proj_name=ckpt_names[2],
        is_fused_checkpoint_transposed=is_fused_checkpoint_transposed,
    )
    return MoERunner(prefix, experts, gate=gate, shared_experts=shared_experts)


def make_expert_params_mapping(
    model: nn.Module,
    ckpt_gate_proj_name: str,
    ckpt_down_proj_name: str,
    ckpt_up_proj_name: str | None,
    num_experts: int,
    num_redundant_experts: int = 0,
    routed_experts_prefix: str = "routed_experts",
) -> ExpertMapping:
    """The mapping a hand-written ``load_weights`` indexes its parameters with (vLLM's
    ``FusedMoE.make_expert_params_mapping``): per expert, names relative to the layer holding
    ``experts``, with the LoRA ``base_layer.`` prefix where the model has one."""
    # a parameter name holds ".base_layer." only under a module of that name: looked for first
    has_base_layer = any("base_layer" in m._modules for m in submodules(model)) and any(
        ".base_layer." in n for n, _ in named_parameters(model)
    )
    prefix = "base_layer." if has_base_layer else ""
    return build_expert_params_mapping(
        ckpt_gate_proj_name,
        ckpt_down_proj_name,
        ckpt_up_proj_name,
        num_experts,
        num_redundant_experts,
        routed_experts_prefix,
        lora_base_layer_prefix=prefix,
        lora_base_layer_prefix_on_param_name=prefix,
    )
