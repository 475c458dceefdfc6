"""The story behind notebook 05: its charts come from real multi-process runs."""

from __future__ import annotations

import pytest

from loadkit.demo.stories import tensor_parallel as story
from loadkit.demo.viz import figure


def block(record, rank: int, key: str) -> list[int]:
    """The heatmap cells of ``key`` in ``rank``'s line."""
    cols = story.columns()
    z = record.series["checkpoint rows held"].z
    start = cols.starts[key]
    return z[rank][start : start + cols.sizes[key]]


Q = f"{story.L0}self_attn.q_proj.weight"
K = f"{story.L0}self_attn.k_proj.weight"


def test_main_records_are_the_gguf_bug_at_tp2():
    recs = story.main_records()
    assert list(recs) == ["old", "new"]
    old, new = recs["old"], recs["new"]
    assert block(old, 1, Q) == block(old, 0, Q) == [1] * 32 + [0] * 32  # rank 1 on shard 0
    assert block(new, 1, Q) == [0] * 32 + [1] * 32
    assert old.outcome["logits"] == "DIFFER from tp=1"
    assert new.outcome["logits"].startswith("equal to tp=1")
    # The gaps between keys are empty cells, not rows anybody holds.
    gap = story.columns().starts[K] - 1
    assert all(line[gap] is None for line in old.series["checkpoint rows held"].z)


def test_kv_bug_at_tp4_shows_replication_and_the_failed_ranks():
    recs = story.records("kv-replication", 4)
    assert [block(recs["new"], r, K)[:8] for r in range(4)] == [[1] * 8, [1] * 8, [0] * 8, [0] * 8]
    assert block(recs["old"], 1, K) == [0] * 8 + [1] * 8  # the wrong head
    assert block(recs["old"], 2, K) == [0] * 16  # its load failed before k_proj.weight
    assert recs["old"].outcome["ranks"] == "skipped skipped load error load error"
    counters = story.records("kv-replication", 4, "counters")["old"]
    assert sum(counters.series["rank 2"].y) < sum(counters.series["rank 0"].y)
    logits = story.records("kv-replication", 4, "logits")
    assert list(logits["old"].series) == ["tp=1"] and list(logits["new"].series) == ["tp=1", "tp=4"]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_new_logits_equal_tp1_and_the_heatmap_draws(tp):
    rec = story.records("gguf-rank", tp)["new"]
    assert rec.outcome["logits"].startswith("equal to tp=1")
    fig = figure(rec, widget=False)
    assert fig.data[0].type == "heatmap" and len(fig.data[0].z) == tp


def test_row_map_text_names_failed_ranks():
    text = story.row_map_text("kv-replication", "old", 4)
    line = next(x for x in text.splitlines() if x.startswith(K))
    assert line.split()[-4:] == ["0-7", "8-15", "failed", "failed"]
