"""Notebook 05's runs (its own ``launch``) and what ``loadkit_notebooks.stories.tensor_parallel``
draws of them: every record comes from real rank processes."""

from __future__ import annotations

import pytest
from notebook_code import notebook_namespace

from loadkit_notebooks.stories import tensor_parallel as story

pytestmark = pytest.mark.slow  # every record comes from real rank processes

Q = f"{story.L0}self_attn.q_proj.weight"
K = f"{story.L0}self_attn.k_proj.weight"
OPROJ = f"{story.L0}self_attn.o_proj.weight"
G = f"{story.L0}mlp.gate_proj.weight"
NOT, FIX, WRONG, MISSING = story.NOT_HELD, story.HELD, story.WRONG, story.MISSING


def launch(tp):
    """The notebook's ``launch`` (cached there, per tp)."""
    return notebook_namespace("05_tensor_parallel.ipynb")["launch"](tp)


def block(record, rank: int, key: str) -> list[int]:
    """The heatmap cells of ``key`` in ``rank``'s line."""
    cols = story.columns(launch)
    z = record.series["checkpoint rows"].z
    start = cols.starts[key]
    return z[rank][start : start + cols.sizes[key]]


def test_main_records_are_the_gguf_bug_at_tp2():
    recs = story.main_records(launch)
    assert list(recs) == ["old", "new"]
    old, new = recs["old"], recs["new"]
    # Rank 1 on shard 0: red where it holds rank 0's rows, amber where its own rows are missing.
    assert block(old, 0, Q) == [FIX] * 32 + [NOT] * 32
    assert block(old, 1, Q) == [WRONG] * 32 + [MISSING] * 32
    assert block(new, 1, Q) == [NOT] * 32 + [FIX] * 32
    assert old.outcome["logits"].startswith("DIFFER at")
    assert new.outcome["logits"].startswith("equal within")
    # The gaps between keys are empty cells, not rows anybody holds.
    gap = story.columns(launch).starts[K] - 1
    assert all(line[gap] is None for line in old.series["checkpoint rows"].z)


def test_the_contrast_holds_old_then_new_lines():
    rec = story.contrast_record(launch, "kv-replication", 4)
    s = rec.series["checkpoint rows"]
    assert s.y == [
        "old · rank 0: forward skipped",
        "old · rank 1: forward skipped",
        "old · rank 2: load failed",
        "old · rank 3: load failed",
        "new · rank 0",
        "new · rank 1",
        "new · rank 2",
        "new · rank 3",
    ]
    assert block(rec, 1, K) == [MISSING] * 8 + [WRONG] * 8  # old rank 1: the wrong head
    assert block(rec, 5, K) == [FIX] * 8 + [NOT] * 8  # new rank 1: head 0, replicated
    assert all(c in (FIX, NOT, None) for line in s.z[4:] for c in line)


def test_row_parallel_keys_are_mapped_by_their_columns():
    """o_proj is split along its 64 input columns: each rank's half, and nothing spills over
    into the next key's cells (the gate_proj block right after it is untouched by o_proj)."""
    cols = story.columns(launch)
    assert cols.axes[OPROJ] == "cols" and cols.sizes[OPROJ] == 64 and cols.axes[Q] == "rows"
    new = story.records(launch, "gguf-rank", 2)["new"]
    assert block(new, 0, OPROJ) == [FIX] * 32 + [NOT] * 32
    assert block(new, 1, OPROJ) == [NOT] * 32 + [FIX] * 32
    assert block(new, 1, G) == [NOT] * 32 + [FIX] * 32


def test_kv_bug_at_tp4_shows_replication_and_the_failed_ranks():
    recs = story.records(launch, "kv-replication", 4)
    fixed = [block(recs["new"], r, K)[:8] for r in range(4)]
    assert fixed == [[FIX] * 8, [FIX] * 8, [NOT] * 8, [NOT] * 8]  # head 0 on ranks 0 and 1
    assert block(recs["old"], 1, K) == [MISSING] * 8 + [WRONG] * 8  # the wrong head
    assert WRONG not in block(recs["old"], 2, K)  # its load failed before k_proj.weight
    assert recs["old"].outcome["ranks"] == "skipped skipped load error load error"
    counters = story.counters_figure(launch, "kv-replication", 4, "old")
    assert counters.layout.title.text.endswith("rank 2, 3 not as under the fix [old]")
    assert [t.name for t in counters.data][2:] == ["rank 2: load failed", "rank 3: load failed"]
    shares = [list(t.y) for t in counters.data]
    assert all(v == 100 for v in shares[0]) and min(shares[2]) < 100 and min(shares[3]) < 100
    logits = story.logits_figure(launch, "kv-replication", 4, "old")
    assert [t.name for t in logits.data] == ["tp=1"]
    (note,) = logits.layout.annotations
    assert note.text.startswith(
        "no tp=4 logits: rank 0, 1: forward skipped; rank 2, 3: load failed"
    )
    assert [t.name for t in story.logits_figure(launch, "kv-replication", 4, "new").data] == [
        "tp=1",
        "tp=4, equal to tp=1",
    ]


def test_logit_dots_are_coloured_by_agreement_not_behaviour():
    """kv-replication at tp=2 has nothing to replicate: old equals tp=1, so its dots are blue."""
    names = [t.name for t in story.logits_figure(launch, "kv-replication", 2, "old").data]
    assert names == ["tp=1", "tp=2, equal to tp=1"]
    names = [t.name for t in story.logits_figure(launch, "gguf-rank", 1, "old").data]
    assert names == ["tp=1", "tp=1, equal to tp=1"]
    fig = story.logits_figure(launch, "gguf-rank", 2, "old")
    assert [t.name for t in fig.data][-1] == "tp=2, differs from tp=1"


def test_gguf_bug_counters_look_healthy():
    """The bug's point: every rank copied as many elements as under the fix, although the raw
    counters differ between ranks (the padded vocabulary's last slice)."""
    fig = story.counters_figure(launch, "gguf-rank", 4, "old")
    assert "every rank as under the fix" in fig.layout.title.text
    assert all(v == 100 for t in fig.data for v in t.y)
    raw = [[got for got, _ in t.customdata] for t in fig.data]
    assert raw[0] != raw[3]  # the vocabulary padding, not the bug


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_new_logits_equal_tp1_and_the_heatmap_draws(tp):
    rec = story.records(launch, "gguf-rank", tp)["new"]
    assert rec.outcome["logits"].startswith("equal within")
    fig = story.rows_figure(rec)
    assert fig.data[0].type == "heatmap" and len(fig.data[0].z) == tp
    assert fig.layout.title.text.endswith(f"tp={tp}, gguf-plugin #103 [new]")


def test_row_map_text_names_failed_ranks():
    text = story.row_map_text(launch(4)["kv-replication/old"])
    line = next(x for x in text.splitlines() if x.startswith(K))
    assert line.split()[-4:] == ["0-7", "8-15", "failed", "failed"]


def test_explorer_widgets_drive_the_charts_and_return_to_main_records():
    pytest.importorskip("anywidget")
    ex = story.explorer(launch)
    start = ex.state()
    assert start.startswith("[bug gguf-rank, tp 2, old]")
    assert ex.rows.fig.to_dict() == story.rows_figure(story.main_records(launch)["old"]).to_dict()
    ex.tp.value, ex.bug.value, ex.toggle.value = "4", "kv-replication", "new"
    assert (
        ex.rows.fig.to_dict()
        == story.rows_figure(story.records(launch, "kv-replication", 4)["new"]).to_dict()
    )
    assert (
        ex.counters.fig.to_dict()
        == story.counters_figure(launch, "kv-replication", 4, "new").to_dict()
    )
    assert (
        ex.logits.fig.to_dict() == story.logits_figure(launch, "kv-replication", 4, "new").to_dict()
    )
    ex.tp.value, ex.bug.value, ex.toggle.value = "2", "gguf-rank", "old"
    assert ex.state() == start
