"""What layerwise reload costs over a plain copy (issue 5).

    .venv/bin/python benchmarks/reload_overhead.py [--repeats 15] [--threads 1]

A NemotronH-like model of about 230 MB (bfloat16, as served) is loaded once, its metadata recorded,
and then the same in-memory update is applied, alternately and ``--repeats`` times each:

- counted: ``initialize_layerwise_reload`` + ``model.load_weights(update)`` + ``finalize``; every
  call counted on meta, every layer materialised (NaN), replayed and copied back;
- plain: each checkpoint tensor ``copy_``-ed straight into its destination (the same parameters,
  the same bytes; the q/k/v shards into their rows of ``qkv_proj``): the memory-bound floor;
- load_weights: the model's ordinary load path without reload (the name walk + one copy).

The JSON reports the best (minimum) wall time of each: on a shared machine the other processes
only ever add time, so the minimum is the cost of the work itself; medians are printed too. A
further instrumented run splits the counted time into counting, the finalisation (materialise,
replay, copy back) and the rest. The last line is JSON:
``{"model_mb": X, "counted_s": A, "plain_s": B, "ratio": A/B}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from collections.abc import Callable

import torch

from loadkit.models.nemotron_h import NemotronHConfig, NemotronHForCausalLM, make_checkpoint
from loadkit.reload import layer as reload_layer
from loadkit.reload import layerwise as reload_mod

CONFIG = NemotronHConfig(
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
)


def plain_pairs(model: NemotronHForCausalLM, update: dict[str, torch.Tensor]) -> list:
    """(destination view, checkpoint tensor) for every checkpoint tensor."""
    params = dict(model.named_parameters())
    pairs = []
    for name, w in update.items():
        mapped, shard = model.hf_to_vllm_mapper.map_name_with_shard(name)  # type: ignore[misc]
        dest = params[mapped].data
        if shard is not None:
            start, size = model.get_submodule(mapped.rsplit(".", 2)[0]).shards[shard]
            dest = dest.narrow(0, start, size)
        pairs.append((dest, w))
    return pairs


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _timer_into(spent: dict[str, float]) -> Callable:
    def timer(fn: Callable, label: str) -> Callable:
        def timed_call(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t

        return timed_call

    return timer


def breakdown(counted: Callable[[], None], runs: int) -> dict[str, float]:
    """Counted reloads with timers around counting and the three steps of finalisation.

    Returns the split of the fastest of ``runs`` instrumented reloads.
    """
    targets = [
        (reload_mod, "get_numel_loaded", "counting"),
        (reload_layer.LayerReload, "materialise", "materialise (NaN fill)"),
        (reload_layer.LayerReload, "replay", "replay"),
        (reload_layer.LayerReload, "copy_back", "copy back"),
    ]
    originals = [getattr(owner, attr) for owner, attr, _ in targets]
    splits = []
    for _ in range(runs):
        spent = dict.fromkeys([label for _, _, label in targets], 0.0)
        timer = _timer_into(spent)

        for (owner, attr, label), fn in zip(targets, originals, strict=True):
            setattr(owner, attr, timer(fn, label))
        try:
            total = timed(counted)
        finally:
            for (owner, attr, _), fn in zip(targets, originals, strict=True):
                setattr(owner, attr, fn)
        spent["rest (walk, wrappers, bookkeeping)"] = total - sum(spent.values())
        spent["total"] = total
        splits.append(spent)
    return min(splits, key=lambda s: s["total"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    # One thread by default: on a shared 2-core machine two-thread runs swing with the neighbours'
    # load (ratios of 2.5 to 5 in one afternoon); single-threaded ones repeat to a few percent.
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = NemotronHForCausalLM(CONFIG)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model.load_weights(make_checkpoint(CONFIG, seed=0).items())
    update = make_checkpoint(CONFIG, seed=1)
    reload_mod.record_metadata_for_reloading(model)
    pairs = plain_pairs(model, update)
    layers = len(reload_mod._layers(model))
    print(
        f"model: {model_bytes / 1e6:.1f} MB in {layers} layers, {len(update)} checkpoint tensors, "
        f"{CONFIG.dtype}, torch threads {torch.get_num_threads()}"
    )

    def plain() -> None:
        for dest, w in pairs:
            dest.copy_(w)

    def counted() -> None:
        reload_mod.initialize_layerwise_reload(model, behaviour="new")
        model.load_weights(update.items())
        reload_mod.finalize_layerwise_reload(model)

    def ordinary() -> None:
        model.load_weights(update.items())

    runs: dict[str, list[float]] = {"counted": [], "plain": [], "load_weights": []}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning here would mean the reload went wrong
        for fn in (plain, counted, ordinary):
            fn()  # warm-up: one-time imports and allocations
        for _ in range(args.repeats):
            runs["plain"].append(timed(plain))
            runs["counted"].append(timed(counted))
            runs["load_weights"].append(timed(ordinary))
        split = breakdown(counted, max(3, args.repeats // 3))
    med = {k: statistics.median(v) for k, v in runs.items()}
    best = {k: min(v) for k, v in runs.items()}
    for k, v in runs.items():
        print(f"{k:>12}: min {best[k]:.4f} s, median {med[k]:.4f} s, max {max(v):.4f} s")
    print(f"ratio of medians: {med['counted'] / med['plain']:.3f}")
    print(
        "counted split (fastest instrumented run): "
        + ", ".join(f"{k} {v:.4f} s" for k, v in split.items())
    )
    print(
        f"plain copy bandwidth (best run): {2 * model_bytes / best['plain'] / 1e9:.2f} GB/s moved "
        "(read + write)"
    )
    print(
        json.dumps(
            {
                "model_mb": round(model_bytes / 1e6, 1),
                "counted_s": round(best["counted"], 4),
                "plain_s": round(best["plain"], 4),
                "ratio": round(best["counted"] / best["plain"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
