"""Per-rank memory of a tensor-parallel load: tp = 1, 2, 4 on a checkpoint of about 1 GiB.

    python benchmarks/tp_memory.py                 # writes data/big/ on first use (~1.1 GB)
    python benchmarks/tp_memory.py --checkpoint PATH --tp 1 2 4

Each ``tp`` is one ``run_tensor_parallel`` launch: ``tp`` real processes (gloo on loopback), each
building its share of the Llama-like model and streaming the whole checkpoint from disk through a
buffer-reusing reader. Every rank measures its anonymous memory (``RssAnon``: page-cache pages of
the checkpoint file do not count) before building the model and after every tensor it streams;
the growth reported is the peak minus that baseline: the rank's parameters plus whatever loading
needed on the way (the read buffer, one tensor).

The ideal for a rank is ``sharded / tp + replicated``: the parameters that split, divided by tp,
plus those every rank holds whole (norms, row-parallel biases), from the model on the meta device
at tp=1. The plan column is what the sharding really gives a rank (kv heads replicated when tp
exceeds them, padded vocabulary rows): the part of the gap that is by design. Logits of each run
are checked against tp=1. Progress bars show each rank's bytes streamed.

The last line printed is JSON. Not part of ``make test``: it writes 1.1 GB and takes minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO / "data" / "big" / "llama_like_bench.safetensors"
MiB = 2**20


def ensure_checkpoint(path: Path) -> None:
    if path.exists():
        return
    from llama_checkpoint import PRESETS  # beside this script

    from loadkit.models import llama

    print(f"writing {path} (once; data/big/ is ignored by git)", file=sys.stderr)
    llama.write_checkpoint(path, PRESETS["bench"], progress=True)


def warm_page_cache(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 * MiB):
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT)
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = ap.parse_args()

    from loadkit import open_checkpoint
    from loadkit.executor.launcher import run_one
    from loadkit.models.llama import model_from_checkpoint
    from loadkit_inspect.tensor_parallel.share import memory_plan

    ensure_checkpoint(args.checkpoint)
    ck = open_checkpoint(args.checkpoint)
    warm_page_cache(args.checkpoint)
    print(f"{args.checkpoint}: {len(ck)} tensors, {ck.total_bytes / MiB:.1f} MiB", file=sys.stderr)

    rows, reference = [], None
    for tp in args.tp:
        plan = memory_plan(ck.tensors, tp, model_from_checkpoint)
        run = run_one(
            args.checkpoint,
            tp,
            model=model_from_checkpoint,
            track_rows=False,
            progress=not args.no_progress,
            timeout=1800,
            collective_timeout=600,
            input_ids=[1, 7, 42, 99],
        ).raise_for_errors()
        if reference is None:
            reference = run.logits
        same = bool(np.allclose(run.logits, reference, atol=1e-3))
        for r in run.ranks:
            rows.append(
                {
                    "tp": tp,
                    "rank": r.rank,
                    "anon_growth_mib": round(r.anon_growth / MiB, 1),
                    "params_mib": round(r.param_bytes / MiB, 1),
                    "plan_mib": round(plan.per_rank[r.rank] / MiB, 1),
                    "ideal_mib": round(plan.ideal_per_rank / MiB, 1),
                    "ratio_to_ideal": round(r.anon_growth / plan.ideal_per_rank, 3),
                    "load_s": round(r.load_seconds, 2),
                    "logits_equal_tp1": same,
                }
            )
        print(
            f"tp={tp}: sharded {plan.sharded_bytes / MiB:.1f} MiB, replicated "
            f"{plan.replicated_bytes / MiB:.2f} MiB, "
            f"ideal per rank {plan.ideal_per_rank / MiB:.1f} MiB",
            file=sys.stderr,
        )

    print(
        f"{'tp':>3} {'rank':>4} {'anon MiB':>9} {'plan MiB':>9} {'ideal MiB':>10} "
        f"{'ratio':>6} {'load s':>7}"
    )
    for row in rows:
        print(
            f"{row['tp']:>3} {row['rank']:>4} {row['anon_growth_mib']:>9} {row['plan_mib']:>9} "
            f"{row['ideal_mib']:>10} {row['ratio_to_ideal']:>6} {row['load_s']:>7}"
        )
    print(json.dumps({"checkpoint_mib": round(ck.total_bytes / MiB, 1), "ranks": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
