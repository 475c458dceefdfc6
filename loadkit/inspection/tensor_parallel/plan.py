"""``loadkit inspect --tp N``: what each of ``N`` ranks would hold, and what cannot work.

Header-only: every rank's model is built on the meta device inside a simulated group and loaded
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

from loadkit.checkpoint.reader import TensorInfo
from loadkit.errors import LoadkitError
from loadkit.inspection.tensor_parallel.rowmap import RowMapEntry, render_row_map, row_map
from loadkit.inspection.tensor_parallel.share import RankShare, simulate_rank


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
    ranks: list[RankShare] = field(default_factory=list)
    entries: list[RowMapEntry] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings) and not any(
            r.error for r in self.ranks
        )

    def problems(self) -> list[str]:
        out = [f"tp={self.tp}: {f.message}" for f in self.findings if f.severity == "error"]
        out += [f"tp={self.tp}: rank {r.rank}: {r.error}" for r in self.ranks if r.error]
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "ok": self.ok,
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

        lines = [f"tensor parallel  tp={self.tp} (each rank simulated on the meta device)"]
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


def tp_report(
    tensors: Mapping[str, TensorInfo],
    build: Callable[[], nn.Module],
    tp: int,
) -> TPReport:
    """Simulate every rank of ``tp`` (``build()`` runs inside each rank's simulated group)."""
    from loadkit.parallel.state import simulated_group, use_group

    report = TPReport(tp)
    if tp < 1:
        report.findings.append(TPFindingRecord("error", "tp", f"tp must be at least 1, not {tp}"))
        return report
    with use_group(simulated_group(0, 1)):
        findings = _findings(build(), tp)
    if findings is not None:
        report.findings = findings
    if not report.ok:
        return report  # the model says it cannot be split this way: nothing to simulate
    try:
        report.ranks = [simulate_rank(tensors, r, tp, build) for r in range(tp)]
    except LoadkitError as exc:  # building failed: a size that does not split
        report.findings.append(TPFindingRecord("error", "model", str(exc)))
        report.ranks = []
        return report
    if (
        report.ranks
        and all(r.param_bytes == report.ranks[0].param_bytes for r in report.ranks)
        and findings is None
    ):
        whole = simulate_rank(tensors, 0, 1, build).param_bytes
        if whole == report.ranks[0].param_bytes:
            report.findings.append(
                TPFindingRecord(
                    "note",
                    "replicated",
                    "no tensor-parallel layers: every rank holds the whole model",
                )
            )
    report.entries = row_map([r.records for r in report.ranks])
    return report
