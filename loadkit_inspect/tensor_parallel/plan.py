"""``loadkit inspect --tp N``: what each of ``N`` ranks would hold, and what cannot work.

Header-only: every rank's model is built on the meta device inside a stand-in group and loaded
with meta tensors (``share``), so the plan is what the real loaders would do.
A model may also say up front what ``tp`` does to it (``config.verify_tensor_parallel(tp)``:
heads or intermediate size not divisible, kv heads replicated, vocabulary padded); otherwise the
first size that does not split is reported from building the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from loadkit.checkpoint import TensorInfo
from loadkit.errors import LoadkitError
from loadkit.parallel import size_findings
from loadkit_inspect.tensor_parallel.rowmap import RowMapEntry, render_row_map, row_map
from loadkit_inspect.tensor_parallel.share import RankShare, dry_load_rank

REFUSED_BY_CONFIG = "attention heads"  # the one tp check vLLM makes on the config itself


@dataclass
class TPFindingRecord:
    severity: str  # "error" (cannot work) or "note" (works, at a cost)
    subject: str
    message: str


@dataclass
class TPReport:
    """The ``--tp`` section of an inspect report."""

    tp: int
    findings: list[TPFindingRecord] = field(default_factory=list)
    # why no rank was simulated (only the config checked, as vLLM checks it); None: simulated
    not_simulated: str | None = None
    ranks: list[RankShare] = field(default_factory=list)
    entries: list[RowMapEntry] = field(default_factory=list)

    @property
    def simulated(self) -> bool:
        """Were the ranks simulated (else only the config was checked)?"""
        return self.not_simulated is None

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings) and not any(
            r.error for r in self.ranks
        )

    @property
    def refusal(self) -> TPFindingRecord | None:
        """The attention heads not divisible by ``tp``: vLLM raises for it before building
        anything (``ModelConfig.verify_with_parallel_config``, vllm/config/model.py:1579 in
        0.34.0), so no later check is reached."""
        errors = (f for f in self.findings if f.severity == "error")
        return next((f for f in errors if f.subject == REFUSED_BY_CONFIG), None)

    def problems(self) -> list[str]:
        """One phrase for the ``vllm`` verdict (``tp=N`` said once): vLLM's refusal alone when
        it refuses, else every error of the findings and the ranks."""
        refusal = self.refusal
        if refusal is not None:
            return [f"tp={self.tp} refused: {refusal.message}"]
        errors = [f.message for f in self.findings if f.severity == "error"]
        errors += [f"rank {r.rank}: {r.error}" for r in self.ranks if r.error]
        return [f"tp={self.tp}: {'; '.join(errors)}"] if errors else []

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "ok": self.ok,
            "simulated": self.simulated,
            "not_simulated": self.not_simulated,
            "findings": [vars(f) for f in self.findings],
            "ranks": [
                {
                    "rank": r.rank,
                    "param_bytes": r.param_bytes,
                    "loaded_elements": sum(r.loaded_per_layer.values()),
                    "error": r.error,
                }
                for r in self.ranks
            ],
            "rows": [
                {"key": e.key, "param": e.param, "axis": e.axis, "size": e.size, "spans": e.spans}
                for e in self.entries
            ],
        }

    def render(self, limit: int = 20) -> list[str]:
        from loadkit.fmt import format_bytes as fmt_bytes
        from loadkit.fmt import wrap

        if self.simulated:
            lines = [f"tensor parallel  tp={self.tp} (each rank simulated on the meta device)"]
        else:
            head = (
                f"tensor parallel  tp={self.tp} ({self.not_simulated}: no rank was simulated; "
                "its config checked as vLLM checks it)"
            )
            lines = wrap(head, hang=17).split("\n")
        for f in self.findings:  # wrapped: reports are read in terminals and notebooks
            lines += wrap(f"  {f.severity:<5} {f.subject}: {f.message}", hang=6).split("\n")
        if not self.ranks:
            return lines
        lines.append("  rank  parameter bytes  elements loaded  load")
        for r in self.ranks:
            status = "ok" if r.error is None else f"FAILS: {r.error}"
            lines.append(
                f"  {r.rank:<4}  {fmt_bytes(r.param_bytes):<15}  "
                f"{sum(r.loaded_per_layer.values()):<15}  {status}"
            )
        if self.entries:
            lines.append("  rows each rank takes (layer 0; the other layers split alike)")
            failed = {r.rank: r.error for r in self.ranks if r.error}
            table = render_row_map(self.entries, failed=failed).splitlines()
            lines += ["    " + row for row in table[: limit + 1]]
            if len(table) > limit + 1:
                lines.append(f"    ... {len(table) - limit - 1} more")
        return lines


def _findings(model: nn.Module, tp: int) -> list[TPFindingRecord] | None:
    verify = getattr(getattr(model, "config", None), "verify_tensor_parallel", None)
    if not callable(verify):
        return None
    return [TPFindingRecord(f.severity, f.subject, f.message) for f in verify(tp)]


def _has_parallel_layers(model: nn.Module) -> bool:
    from loadkit.parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

    kinds = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)
    return any(isinstance(m, kinds) for m in model.modules())


def _int(config: object, name: str) -> int | None:
    value = getattr(config, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def config_findings(model: nn.Module, tp: int) -> list[TPFindingRecord] | None:
    """What vLLM checks of a Hugging Face config for ``tp`` (``ModelConfig
    .verify_with_parallel_config``: the attention heads divisible by ``tp``; its layers: kv heads
    split or replicated evenly, the vocabulary padded to a multiple of 64 and split evenly), for
    a model with a ``config`` that has ``num_attention_heads``; ``None`` without one."""
    config: Any = getattr(model, "config", None)
    get_text = getattr(config, "get_text_config", None)
    text = get_text() if callable(get_text) else config
    heads = _int(text, "num_attention_heads")
    if heads is None:
        return None
    kv = _int(text, "num_key_value_heads") or heads
    out = []
    for f in size_findings(tp, heads=heads, kv_heads=kv, vocab_size=_int(text, "vocab_size")):
        message = f.message
        if f.subject == REFUSED_BY_CONFIG:  # vLLM's own words (vllm/config/model.py:1368)
            message = (
                f"Total number of attention heads ({heads}) must be divisible by tensor "
                f"parallel size ({tp})"
            )
        out.append(TPFindingRecord(f.severity, f.subject, message))
    return out


def config_report(model: nn.Module, tp: int, why: str) -> TPReport:
    """What vLLM checks of ``model``'s config for ``tp`` before it builds anything, no rank
    simulated (``why``: a model whose ranks cannot stand for vLLM's)."""
    findings = [_below_one(tp)] if tp < 1 else config_findings(model, tp)
    return TPReport(tp, findings or [], not_simulated=why)


def _below_one(tp: int) -> TPFindingRecord:
    return TPFindingRecord("error", "tp", f"tp must be at least 1, not {tp}")


def tp_report(
    tensors: Mapping[str, TensorInfo],
    build: Callable[[], nn.Module],
    tp: int,
) -> TPReport:
    """Dry-load every rank of ``tp`` (``build()`` runs inside each rank's stand-in group)."""
    from loadkit.parallel import stand_in_group, use_group

    report = TPReport(tp)
    if tp < 1:
        report.findings.append(_below_one(tp))
        return report
    with use_group(stand_in_group(0, 1)):
        model = build()
        findings = _findings(model, tp)
    parallel = _has_parallel_layers(model)
    from_config = getattr(model, "hf_config", None) is not None  # --model hf: vLLM's order
    if findings is None and (from_config or not parallel):
        # vLLM checks the config before it builds anything (the heads), then each layer as
        # it is built on each rank: the config's findings first, then the ranks.
        findings = config_findings(model, tp)
        if findings is None and not parallel:
            raise LoadkitError(
                f"--tp {tp}: {type(model).__name__} has no tensor-parallel layers and no config "
                "with num_attention_heads: there is nothing of what vLLM checks for tp to check "
                "here, and no rank's share to simulate"
            )
        if not parallel:
            # Every rank would hold the whole model here: simulating ranks proves nothing.
            report.findings = findings or []
            report.not_simulated = "the model has no tensor-parallel layers"
            return report
    report.findings = findings or []
    if not report.ok:
        return report  # vLLM refuses this split before any weight is loaded
    try:
        report.ranks = [dry_load_rank(tensors, r, tp, build) for r in range(tp)]
    except LoadkitError as exc:  # building failed: a size that does not split
        report.findings.append(TPFindingRecord("error", "model", str(exc)))
        report.ranks = []
        return report
    report.entries = row_map([r.records for r in report.ranks])
    return report
