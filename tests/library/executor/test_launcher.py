"""Tensor-parallel loads on real processes (torch.distributed, gloo on loopback).

One tiny Llama-like checkpoint (8 query heads over 2 kv heads, vocabulary 100 padded to 128) is
loaded on 1, 2 and 4 ranks, with every bug fixed and with each bug's old behaviour. The tp=1
run is the reference. Each launch runs several jobs in one process group, and the ranks fork
from a server that imported torch once, so the whole module takes seconds.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from loadkit.executor.launcher import run_one, run_tensor_parallel
from loadkit.executor.results import Fault, Job
from loadkit.models.llama import (
    LlamaLikeConfig,
    checkpoint_layout,
    model_from_checkpoint,
    write_checkpoint,
)
from loadkit.parallel.state import TensorParallelError
from loadkit_inspect.tensor_parallel.share import dry_load_ranks, memory_plan

pytestmark = pytest.mark.slow  # real rank processes

LLAMA = model_from_checkpoint  # the model every run here loads
JOBS = [Job(), Job.for_bug("gguf-rank", "old"), Job.for_bug("kv-replication", "old")]
ATOL = 1e-5  # tp changes the order of the sums, not the values (dyadic weights)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("tp") / "tiny.safetensors", LlamaLikeConfig())


@pytest.fixture(scope="module")
def runs(checkpoint):
    out = {1: {"new": run_one(checkpoint, 1, model=LLAMA)}}
    for tp in (2, 4):
        out[tp] = {
            run.job.name: run for run in run_tensor_parallel(checkpoint, tp, JOBS, model=LLAMA)
        }
    return out


def held_rows(run, rank: int, key: str):
    """The checkpoint rows (or columns, for row-parallel weights) ``key`` gave rank ``rank``."""
    return [rec.held[1] for rec in run.ranks[rank].records if rec.key == key]


L0 = "model.layers.0."


def test_tp1_reference_loads_every_key(runs):
    ref = runs[1]["new"].raise_for_errors()
    assert ref.logits.shape == (8, 100)
    counts = ref.ranks[0].ledger["counts"]["checkpoint"]
    keys = len(checkpoint_layout(LlamaLikeConfig()))
    assert counts["unconsumed"] == 0 and counts["loaded"] + counts["delegated"] == keys == 33


@pytest.mark.parametrize("tp", [2, 4])
def test_new_gives_the_tp1_logits(runs, tp):
    run = runs[tp]["new"].raise_for_errors()
    assert np.allclose(run.logits, runs[1]["new"].logits, atol=ATOL)
    # every rank computed the same (all-gathered) logits
    for r in run.ranks:
        assert np.array_equal(r.logits, run.ranks[0].logits)


@pytest.mark.parametrize("tp", [2, 4])
def test_gguf_old_every_rank_holds_shard0_and_the_logits_are_wrong(runs, tp):
    old, new = runs[tp]["gguf-rank/old"].raise_for_errors(), runs[tp]["new"]
    q_rows, inter_rows = 64 // tp, 64 // tp
    for r in range(tp):
        assert held_rows(old, r, f"{L0}self_attn.q_proj.weight") == [(0, q_rows)]
        assert held_rows(old, r, f"{L0}mlp.gate_proj.weight") == [(0, inter_rows)]
        assert held_rows(old, r, f"{L0}mlp.up_proj.weight") == [(0, inter_rows)]
        assert held_rows(new, r, f"{L0}self_attn.q_proj.weight") == [(r * q_rows, (r + 1) * q_rows)]
        assert held_rows(new, r, f"{L0}mlp.up_proj.weight") == [
            (r * inter_rows, (r + 1) * inter_rows)
        ]
        # The row-parallel and vocabulary loaders always asked the group: unaffected.
        assert held_rows(old, r, f"{L0}mlp.down_proj.weight") == held_rows(
            new, r, f"{L0}mlp.down_proj.weight"
        )
        # Same shapes, same element counts: nothing in the counters gives the bug away.
        assert old.ranks[r].loaded_per_layer == new.ranks[r].loaded_per_layer
    assert np.abs(old.logits - runs[1]["new"].logits).max() > 0.1


def test_kv_old_is_harmless_while_tp_does_not_exceed_kv_heads(runs):
    run = runs[2]["kv-replication/old"].raise_for_errors()
    assert np.allclose(run.logits, runs[1]["new"].logits, atol=ATOL)


def test_kv_old_at_tp4_wrong_head_on_rank1_and_no_head_for_ranks_2_3(runs):
    old, new = runs[4]["kv-replication/old"], runs[4]["new"]
    k = f"{L0}self_attn.k_proj.weight"
    assert [held_rows(new, r, k) for r in range(4)] == [[(0, 8)], [(0, 8)], [(8, 16)], [(8, 16)]]
    assert held_rows(old, 0, k) == [(0, 8)]
    assert held_rows(old, 1, k) == [(8, 16)]  # rank 1 shares head 0 but loaded head 1
    assert [r.status for r in old.ranks] == ["skipped", "skipped", "load error", "load error"]
    for r in (2, 3):
        err = old.ranks[r].error
        assert "qkv_proj" in err and f"rank {r} of 4" in err and "do not exist" in err
        assert f"checkpoint key '{L0}self_attn.k_proj.bias'" in err
    assert "rank 2" in old.ranks[0].error and "rank 3" in old.ranks[0].error
    assert old.logits is None
    with pytest.raises(TensorParallelError, match=r"rank 2: load error.*rank 3: load error"):
        old.raise_for_errors()


@pytest.mark.parametrize("tp", [2, 4])
def test_split_layers_sum_to_tp1_and_replicated_layers_repeat(runs, tp):
    ref = runs[1]["new"].ranks[0].loaded_per_layer
    per_rank = [r.loaded_per_layer for r in runs[tp]["new"].ranks]
    for layer, n in ref.items():
        total = sum(p[layer] for p in per_rank)
        if "norm" in layer:
            assert total == tp * n, layer
        elif layer.endswith("qkv_proj") and tp == 4:
            # 8 q heads split, 2 kv heads replicated twice: q + 2 * (k + v)
            assert total == n + (n // 12 * 2) * 2, layer  # k+v are 2/12 of qkv_proj (8:2:2)
        elif layer.endswith("o_proj"):
            assert total == n + (tp - 1) * 32, layer  # the bias (32) is whole on every rank
        else:
            assert total == n, layer


@pytest.mark.parametrize("tp", [2, 4])
def test_meta_share_without_processes_matches_the_real_ranks(runs, checkpoint, tp):
    for job in JOBS:
        real = runs[tp][job.name]
        shares = dry_load_ranks(checkpoint, tp, functools.partial(job.build, LLAMA))
        for r, share in enumerate(shares):
            assert share.records == real.ranks[r].records, (job.name, r)
            assert share.loaded_per_layer == real.ranks[r].loaded_per_layer
            assert (share.error is None) == (real.ranks[r].status != "load error")
            assert share.param_bytes == real.ranks[r].param_bytes


def test_memory_plan_of_the_tiny_model(checkpoint):
    plan = memory_plan(checkpoint, 4, LLAMA)
    # replicated: 5 norms of 32 or 8 floats per layer... counted by the model, not by hand:
    assert plan.replicated_bytes == 4 * (2 * (32 + 32 + 8 + 8 + 32) + 32)
    assert plan.per_rank[0] > plan.ideal_per_rank  # kv replication and vocab padding cost extra


def test_a_tp_that_does_not_divide_the_heads_fails_before_any_process(checkpoint):
    before = set(psutil.Process().children(recursive=True))
    with pytest.raises(TensorParallelError, match=r"8 attention heads are not divisible by tp=3"):
        run_one(checkpoint, 3, model=LLAMA)
    assert set(psutil.Process().children(recursive=True)) <= before


def assert_all_ended(run):
    for pid in run.pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_rank_killed_mid_load_is_named_and_nothing_hangs(checkpoint):
    start = time.monotonic()
    run = run_one(checkpoint, 2, fault=Fault(rank=1, after_tensors=3, kind="kill"), model=LLAMA)
    assert time.monotonic() - start < 20
    assert run.ranks[1].status == "died" and "SIGKILL" in run.ranks[1].error
    assert run.ranks[0].status == "skipped" and "rank 1" in run.ranks[0].error
    with pytest.raises(TensorParallelError, match=r"rank 1: died: killed by SIGKILL"):
        run.raise_for_errors()
    assert_all_ended(run)


def test_a_rank_that_hangs_times_out_and_is_ended(checkpoint):
    start = time.monotonic()
    hang = Fault(rank=0, after_tensors=2, kind="hang")
    run = run_one(checkpoint, 2, fault=hang, collective_timeout=1.5, model=LLAMA)
    assert time.monotonic() - start < 20
    assert run.ranks[1].status == "skipped"
    assert "rank 0 posted no load status within 1.5 s" in run.ranks[1].error
    assert run.ranks[0].status == "killed"
    assert_all_ended(run)


def test_an_exception_in_one_rank_is_reported_with_its_key(checkpoint):
    run = run_one(checkpoint, 2, fault=Fault(rank=0, after_tensors=5, kind="raise"), model=LLAMA)
    assert run.ranks[0].status == "load error"
    assert "injected fault after 5 tensors" in run.ranks[0].error
    assert "rank 0" in run.ranks[1].error
    assert_all_ended(run)


def test_a_checkpoint_missing_a_shard_on_one_rank(checkpoint, tmp_path):
    # Two shards with an index; rank 1's copy lost its second shard.
    from loadkit import open_checkpoint
    from loadkit.checkpoint.writer import save_in_order

    full = dict(open_checkpoint(checkpoint).weights())
    names = list(full)
    good = tmp_path / "good"
    shards = {
        "model-00001-of-00002.safetensors": names[:15],
        "model-00002-of-00002.safetensors": names[15:],
    }
    for file, keys in shards.items():
        save_in_order(good / file, {k: full[k] for k in keys})
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (good / "model.safetensors.index.json").write_text(json.dumps(index))
    broken = tmp_path / "broken"
    shutil.copytree(good, broken)
    (broken / "model-00002-of-00002.safetensors").unlink()

    run = run_tensor_parallel([good, broken], 2, model=LLAMA)[0]
    assert run.ranks[1].status == "load error"
    assert "model-00002-of-00002.safetensors" in run.ranks[1].error
    assert run.ranks[0].status == "skipped" and "rank 1" in run.ranks[0].error
    assert_all_ended(run)


def test_progress_bars_show_every_rank_of_every_job_to_the_end(checkpoint, capsys):
    from loadkit import open_checkpoint

    total = open_checkpoint(checkpoint).total_bytes
    runs = run_tensor_parallel(checkpoint, 2, JOBS[:2], progress=True, model=LLAMA)
    assert all(run.ok for run in runs)
    err = capsys.readouterr().err
    for job in ("new", "gguf-rank/old"):
        for rank in (0, 1):
            shown = re.findall(rf"{re.escape(job)} rank {rank}: +(\d+)%", err)
            assert shown and shown[-1] == "100", f"{job} rank {rank}: {shown} in\n{err}"
    from tqdm import tqdm

    size = tqdm.format_sizeof(total)
    assert err.count(f"| {size}/{size} [") == 4  # each bar closed at the checkpoint's bytes


def test_a_script_without_the_main_guard_fails_loudly(checkpoint, tmp_path):
    """Each rank process imports the script it was launched from: unguarded, the script launches
    again inside the rank, which dies. The launch raises, naming the guard (no list of dead
    ranks handed back as results), so the script exits non-zero."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from loadkit.executor.launcher import run_one\n"
        "from loadkit.models.llama import model_from_checkpoint\n"
        f"run = run_one({str(checkpoint)!r}, 2, model=model_from_checkpoint)\n"
        "print('returned', run.ok)\n"
    )
    done = subprocess.run(
        [sys.executable, script.name], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "returned" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("loadkit.errors.TensorParallelError: every rank died before reporting")
    assert "rank 0: exited with status 1 without reporting" in last
    assert 'under `if __name__ == "__main__":`' in last


def test_killing_the_launcher_leaves_no_rank_behind(checkpoint, tmp_path):
    """The launcher is SIGKILLed while a rank hangs mid-load: every process it started (the
    fork server and the ranks) ends on its own within seconds."""
    script = tmp_path / "launch.py"
    script.write_text(
        "from loadkit.executor.launcher import run_one\n"
        "from loadkit.executor.results import Fault\n"
        "from loadkit.models.llama import model_from_checkpoint\n"
        "if __name__ == '__main__':\n"
        f"    run_one({str(checkpoint)!r}, 2, fault=Fault(rank=0, after_tensors=2, kind='hang'),\n"
        "            collective_timeout=120, timeout=300, model=model_from_checkpoint)\n"
    )
    launcher = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        started: list[psutil.Process] = []
        while time.monotonic() < deadline:
            started = psutil.Process(launcher.pid).children(recursive=True)
            if len(started) >= 3:  # the fork server and two ranks
                break
            time.sleep(0.2)
        assert len(started) >= 3, f"the launcher started {started}"
        time.sleep(2)  # the ranks are in the load (rank 0 hangs in it)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        gone_by = time.monotonic() + 15
        alive = started
        while alive and time.monotonic() < gone_by:
            alive = [p for p in started if _running(p)]
            time.sleep(0.2)
        assert not alive, f"still running 15 s after the launcher was killed: {alive}"
    finally:
        if launcher.poll() is None:
            launcher.kill()


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_peak_anonymous_memory_per_rank_follows_its_share(tmp_path):
    """Each rank's measured memory growth holds its share of the parameters (the plan) plus at
    most the stream's read buffer (the largest tensor) and a little allocator slack: at tp=2 a
    rank grows about half as much as the tp=1 process. The same measure as
    ``benchmarks/tp_memory.py``, on a 74 MiB checkpoint."""
    from loadkit import open_checkpoint

    config = LlamaLikeConfig(
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
    )
    path = write_checkpoint(tmp_path / "mid.safetensors", config)
    largest = max(t.nbytes for t in open_checkpoint(path).tensors.values())
    slack = 8 * 2**20
    growth = {}
    for tp in (1, 2):
        plan = memory_plan(path, tp, LLAMA)
        run = run_one(path, tp, track_rows=False, model=LLAMA).raise_for_errors()
        for r in run.ranks:
            assert plan.per_rank[r.rank] <= r.anon_growth <= plan.per_rank[r.rank] + largest + slack
        growth[tp] = [r.anon_growth for r in run.ranks]
    for g in growth[2]:
        assert 0.45 < g / growth[1][0] < 0.65


def test_a_job_finished_between_two_polls_still_gets_its_bars(capsys):
    """The launcher polls the counts the ranks post to the store; when a whole job streamed
    between two polls, its bars are still shown, at their final counts, before the next job's."""
    from datetime import timedelta

    import torch.distributed as dist

    from loadkit.executor.launcher import _Bars
    from loadkit.executor.worker import LaunchSpec

    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=5), wait_for_workers=False)
    spec = LaunchSpec(("x", "x"), 2, tuple(JOBS[:2]), (1,), LLAMA)
    for rank in (0, 1):
        store.add(f"progress/0/{rank}", 1000)  # job 0 done before the first poll
        store.add(f"progress/1/{rank}", 400)
    bars = _Bars(spec, 1000)
    bars.update(store, 1)
    bars.close()
    err = capsys.readouterr().err
    for rank in (0, 1):
        assert re.findall(rf"new rank {rank}: +(\d+)%", err)[-1] == "100"
        assert re.findall(rf"gguf-rank/old rank {rank}: +(\d+)%", err)[-1] == "40"
    assert err.index("new rank 0") < err.index("gguf-rank/old rank 0")
