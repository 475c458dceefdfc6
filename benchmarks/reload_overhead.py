"""What a reload costs over a plain copy, in each mode (issues 5 and 38).

    .venv/bin/python benchmarks/reload_overhead.py [--device cpu] [--repeats 15] [--threads 1]
        [--case large,small]

A NemotronH-like model is loaded once, its metadata and checkpoint layout recorded, and then
the same update (already on ``--device``) is applied, each way in turn, ``--repeats`` times:

- plain: each checkpoint tensor ``copy_``-ed straight into its destination (the same
  parameters, the same bytes; q/k/v into their rows of ``qkv_proj``): the floor;
- load_weights: the model's ordinary load path, no reload (the name walk, then one copy each);
- layerwise: ``start_reload`` + ``model.load_weights`` + ``finish_reload`` (vLLM 0.34.0's
  default mode: every call counted on meta, every layer materialised, replayed, copied back);
- direct: the same in ``mode="direct"`` (the loaders write the live storage; no counting);
- planned: ``mode="direct"`` with ``load_planned`` replaying the load plan (traced once,
  before the timing; the names it cannot trace go through ``load_weights``).

Two cases: ``large`` (about 230 MB in bfloat16, 48 tensors: what bytes cost) and ``small``
(a tiny float32 model with 379 checkpoint tensors: what each call costs; the per-tensor
overhead is (mode - plain) / tensors). Every figure is a median of the interleaved runs, and the
ratios are of medians measured side by side in this run: on a shared machine only ratios
repeat. On the CPU the clock is this process's CPU time (``--clock process``): the other
processes of a shared machine do not count, though their cache traffic still does; on a GPU it
is the elapsed time (``--clock wall``). Each run starts after a garbage collection. A cProfile
pass over the small case's layerwise reloads then splits its time. The last line of each case
is JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from loadkit.models.nemotron_h import NemotronHConfig, NemotronHForCausalLM, make_checkpoint
from loadkit.reload import (
    finish_reload,
    load_planned,
    param_metas,
    plan_loads,
    record_checkpoint_layout,
    record_metadata_for_reloading,
    start_reload,
)

CASES = {
    "large": NemotronHConfig(
        vocab_size=16384,
        hidden_size=1024,
        hybrid_override_pattern="M-M*M-M-M-M-",
        mamba_num_heads=32,
        mamba_head_dim=64,
        ssm_state_size=128,
        intermediate_size=4096,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        dtype="bfloat16",
    ),
    "small": NemotronHConfig(hybrid_override_pattern="MM*-M-M" * 8),
}
MODES = ("plain", "load_weights", "layerwise", "direct", "planned")
CLOCKS: dict[str, Callable[[], float]] = {"process": time.process_time, "wall": time.perf_counter}
# The parts of a layerwise reload the profile pass reports (function names in loadkit.reload).
SPLIT = {
    "count_copies": "counting (dispatch mode around each call)",
    "initialize_layerwise_reload": "initialise (layers on meta, loaders wrapped)",
    "finalise": "finalise layers (materialise, replay, copy back)",
    "finalize_layerwise_reload": "finalize (the rest, post-load hooks)",
}


def plain_pairs(model: NemotronHForCausalLM, update: dict[str, torch.Tensor]) -> list:
    """(destination view, checkpoint tensor) for every checkpoint tensor."""
    params = dict(model.named_parameters())
    pairs = []
    for name, w in update.items():
        trace = model.hf_to_vllm_mapper.trace(name)
        assert trace.result is not None
        dest = params[trace.result].data
        if trace.shard_id is not None:
            start, size = model.get_submodule(trace.result.rsplit(".", 2)[0]).shards[trace.shard_id]
            dest = dest.narrow(0, start, size)
        pairs.append((dest, w))
    return pairs


def modes(model: NemotronHForCausalLM, update: dict[str, torch.Tensor]) -> dict[str, Callable]:
    """Each way to apply ``update``, as a function of no arguments."""
    pairs = plain_pairs(model, update)
    items = list(update.items())
    start_reload(model, mode="direct")
    plan = plan_loads(model, param_metas(items))
    finish_reload(model)

    def plain() -> None:
        for dest, w in pairs:
            dest.copy_(w)

    def load_weights() -> None:
        model.load_weights(items)

    def layerwise() -> None:
        start_reload(model)
        model.load_weights(items)
        finish_reload(model)

    def direct() -> None:
        start_reload(model, mode="direct")
        model.load_weights(items)
        finish_reload(model)

    def planned() -> None:
        start_reload(model, mode="direct")
        load_planned(model, plan, items)
        finish_reload(model)

    return dict(zip(MODES, (plain, load_weights, layerwise, direct, planned), strict=True))


def timed(
    fn: Callable[[], object], sync: Callable[[], object], clock: Callable[[], float]
) -> float:
    gc.collect()  # each run pays for its own garbage, not for the previous run's
    sync()
    t = clock()
    fn()
    sync()
    return clock() - t


def profile_split(fn: Callable[[], object], runs: int) -> dict[str, float]:
    """Shares of a layerwise reload's time (under cProfile, which inflates Python calls)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(runs):
        fn()
    prof.disable()
    stats: Any = pstats.Stats(prof).stats
    cum = {key[2]: value[3] for key, value in stats.items() if key[2] in SPLIT}
    top = next(v[3] for k, v in stats.items() if k[2] == "layerwise")
    return {SPLIT[k]: round(v / top, 3) for k, v in cum.items()}


def run_case(
    name: str, config: NemotronHConfig, device: torch.device, repeats: int, clock_name: str
) -> dict:
    with torch.device(device):
        model = NemotronHForCausalLM(config)
    model.load_weights(make_checkpoint(config, seed=0).items())
    record_metadata_for_reloading(model)
    record_checkpoint_layout(model)
    update = {k: v.to(device) for k, v in make_checkpoint(config, seed=1).items()}
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    clock = CLOCKS[clock_name]
    fns = modes(model, update)
    runs: dict[str, list[float]] = {m: [] for m in MODES}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning here would mean a reload went wrong
        for fn in fns.values():
            fn()  # warm-up: one-time imports and allocations
        for _ in range(repeats):
            for m, fn in fns.items():
                runs[m].append(timed(fn, sync, clock))
        split = profile_split(fns["layerwise"], 3) if name == "small" else {}
    med = {m: statistics.median(v) for m, v in runs.items()}
    n = len(update)
    print(
        f"[{name}] {model_bytes / 1e6:.1f} MB, {n} checkpoint tensors, {config.dtype}, {device}, "
        f"{clock_name} time"
    )
    for m in MODES:
        over = (med[m] - med["plain"]) / n * 1e6
        print(
            f"  {m:>12}: median {med[m] * 1e3:9.3f} ms  {med[m] / med['plain']:7.2f}x plain  "
            f"{over:8.1f} us/tensor over plain  (min {min(runs[m]) * 1e3:.3f} ms)"
        )
    if split:
        print("  layerwise split (cProfile, share of its time): " + json.dumps(split))
    result = {
        "case": name,
        "device": str(device),
        "clock": clock_name,
        "tensors": n,
        "model_mb": round(model_bytes / 1e6, 2),
        **{f"{m}_ms": round(med[m] * 1e3, 3) for m in MODES},
        **{f"{m}_x_plain": round(med[m] / med["plain"], 2) for m in MODES[1:]},
        **{f"{m}_us_per_tensor": round((med[m] - med["plain"]) / n * 1e6, 1) for m in MODES[1:]},
    }
    print(json.dumps(result))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="where the model and the update live")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--case", default="large,small", help="comma-separated: large, small")
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        help="process: this process's CPU time (the default on the CPU: a shared machine's "
        "other processes do not count); wall: elapsed time (the default on a GPU, whose work "
        "the CPU time does not see)",
    )
    # One thread by default: on a shared 2-core machine two-thread runs swing with the
    # neighbours' load; single-threaded ones repeat to a few percent.
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    clock = args.clock or ("process" if device.type == "cpu" else "wall")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    for name in args.case.split(","):
        torch.manual_seed(0)
        run_case(name, CASES[name], device, args.repeats, clock)


if __name__ == "__main__":
    main()
