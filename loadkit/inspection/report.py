"""``InspectReport``: what ``inspect_checkpoint`` returns, its ``--json`` document and its text.

Its sections are the pipeline's records (``loadkit.inspection.inspector``): ``checkpoint``
(headers), ``mapper`` (every name traced through the rules), and with a model ``model``,
``probe``, ``load``, ``fix`` and ``tensor_parallel``. Torch-free: the header-only path builds one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loadkit.inspection.layout import LayoutNode, build_layout
from loadkit.inspection.render import render_report
from loadkit.inspection.summary import CheckpointSummary, MapperReport

if TYPE_CHECKING:
    from loadkit.inspection.fix import SuggestedFix
    from loadkit.inspection.records import LoadReport, ModelSummary
    from loadkit.inspection.tensor_parallel.plan import TPReport
    from loadkit.pooling.probe import ProbeVerdict

SCHEMA_VERSION = 3  # docs/inspect.md, "The --json document", says what each version added


def _verdict_dict(v: ProbeVerdict) -> dict[str, Any]:
    return {
        "hit": v.hit,
        "prefix": v.prefix,
        "hit_index": v.hit_index,
        "hit_key": v.hit_key,
        "clones": v.walked,
        "cloned_bytes": v.cloned_bytes,
        "total_keys": v.total_keys,
        "total_bytes": v.total_bytes,
    }


@dataclass(eq=False)
class InspectReport:
    """The report: ``checkpoint`` (headers), and with a model ``model``, ``probe``, ``load``;
    ``mapper`` whenever a mapper is involved. ``render()`` is the CLI's text, ``to_json()`` its
    ``--json`` document."""

    checkpoint: CheckpointSummary
    mapper: MapperReport | None = None
    model: ModelSummary | None = None
    probe: dict[str, ProbeVerdict] | None = None
    load: LoadReport | None = None
    tensor_parallel: TPReport | None = None
    fix: SuggestedFix | None = None  # mapper rules that fix a systematic mismatch, proven
    _layouts: dict[bool, LayoutNode] = field(default_factory=dict, init=False, repr=False)

    def __repr__(self) -> str:
        c = self.checkpoint
        return f"<InspectReport {c.path}: {len(c.tensors)} tensors, clean={self.clean}>"

    def _layout(self, fold: bool) -> LayoutNode:
        if fold not in self._layouts:
            items = ((t.name, t.nbytes, t.dtype, t.shape) for t in self.checkpoint.tensors)
            self._layouts[fold] = build_layout(items, fold=fold)
        return self._layouts[fold]

    @property
    def layout(self) -> LayoutNode:
        """The key tree, one node per dotted prefix (built on first use)."""
        return self._layout(False)

    @property
    def folded_layout(self) -> LayoutNode:
        """The key tree with numbered siblings merged (``layers.{0-27}``): the report's view."""
        return self._layout(True)

    @property
    def clean(self) -> bool | None:
        """Would the checkpoint load cleanly into the model? ``None`` without a model."""
        if self.load is None:
            return None
        return self.load.clean and not self.checkpoint.failing

    @property
    def exit_status(self) -> int:
        """0: loads cleanly (or no model to load into: the headers and index are consistent);
        1: it would not, the index disagrees with the shards, or (with ``tp``) the ranks could
        not hold it."""
        tp_fails = self.tensor_parallel is not None and not self.tensor_parallel.ok
        return 1 if self.clean is False or self.checkpoint.failing or tp_fails else 0

    def problems(self) -> list[str]:
        """Short descriptions of what keeps the checkpoint from loading cleanly."""
        out = []
        if self.checkpoint.failing:
            out.append(f"{len(self.checkpoint.failing)} index problem(s)")
        out += self.load.problems() if self.load is not None else []
        return out + (self.tensor_parallel.problems() if self.tensor_parallel is not None else [])

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "checkpoint": self.checkpoint.as_dict(),
            "layout": self.folded_layout.as_dict(),
            "mapper": self.mapper.as_dict() if self.mapper else None,
            "model": self.model.as_dict() if self.model else None,
            "probe": {b: _verdict_dict(v) for b, v in self.probe.items()} if self.probe else None,
            "load": self.load.as_dict() if self.load else None,
            "tensor_parallel": self.tensor_parallel.as_dict() if self.tensor_parallel else None,
            "suggested_fix": self.fix.as_dict() if self.fix else None,
            "clean": self.clean,
            "exit_status": self.exit_status,
        }

    def to_json(self, indent: int | None = None) -> str:
        """One JSON document; one line by default (json's C encoder: indenting runs in Python
        and costs more than the whole header parse of a 2000-name checkpoint)."""
        return json.dumps(self.as_dict(), indent=indent)

    def render(self, *, limit: int = 20, max_depth: int | None = None) -> str:
        """The report as text: the sections in order, each list capped at ``limit`` rows."""
        return render_report(self, limit=limit, max_depth=max_depth)

    def __str__(self) -> str:
        return self.render()
