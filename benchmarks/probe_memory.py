"""Memory and time of the pooling prefix probe, old vs new, on a real checkpoint on disk.

    python benchmarks/probe_memory.py                 # writes data/big/ on first use (~1.1 GB)
    python benchmarks/probe_memory.py --checkpoint PATH

Each behaviour runs in its own fresh process: it builds the Gemma4-like pooling model, touches
every parameter (so the load's copies fault in nothing new), reads the anonymous memory of the
process (``RssAnon`` in /proc/self/status), then loads the checkpoint from a buffer-reusing
stream and samples ``RssAnon`` after every tensor read. Anonymous memory, because page-cache
pages of a mmap'd file count in plain RSS and would hide the clones. The growth reported is the
peak during the load minus the baseline. The checkpoint is read once before the runs so both
find it in the page cache.

The last line printed is JSON:
``{"tensors": N, "checkpoint_mb": X, "old_anon_mb": A, "new_anon_mb": B, "old_s": S1, "new_s": S2}``
(MiB and seconds). Not part of ``make test``: it writes 1.1 GB and takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO / "data" / "big" / "gemma4_like_bench.safetensors"
MiB = 2**20


def rss_anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    raise RuntimeError("no RssAnon in /proc/self/status (Linux only)")


def child(behaviour: str, path: str) -> dict:
    import torch

    from loadkit import as_pooling_model, open_checkpoint
    from loadkit.models import gemma4 as g4

    ck = open_checkpoint(path)
    config = g4.config_from_checkpoint(ck.tensors)
    # A buffer-reusing read under a load format vLLM 0.34.0 still clones for (as every format
    # did before it): the cost the bug had.
    model = as_pooling_model(
        g4.Gemma4ForConditionalGeneration, behaviour=behaviour, load_format="fastsafetensors"
    )(config)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.fill_(1.0)  # zeros are lazily mapped pages: write them so they are resident now
    base = peak = rss_anon_bytes()

    def sampled(stream):
        nonlocal peak
        for item in stream:
            peak = max(peak, rss_anon_bytes())
            yield item
            peak = max(peak, rss_anon_bytes())  # after the consumer handled it (clones held)

    start = time.perf_counter()
    model.load_weights(sampled(ck.weights(reuse_buffer=True)))
    seconds = time.perf_counter() - start
    rec = model.probe_record
    return {
        "behaviour": behaviour,
        "anon_growth_mb": round((peak - base) / MiB, 1),
        "seconds": round(seconds, 3),
        "held_keys": rec.walked,
        "held_mb": round(rec.walked_bytes / MiB, 1),
        "cloned": rec.cloned,
        "hit_key": rec.hit_key,
        "after_load_mb": round((rss_anon_bytes() - base) / MiB, 1),
    }


def ensure_checkpoint(path: Path) -> None:
    if path.exists():
        return
    from gemma4_checkpoint import BENCH_CONFIG, write_checkpoint  # beside this script

    print(f"writing {path} (once; data/big/ is ignored by git)", file=sys.stderr)
    write_checkpoint(path, BENCH_CONFIG, progress=True)


def warm_page_cache(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 * MiB):
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT)
    ap.add_argument("--child", nargs=2, metavar=("BEHAVIOUR", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0

    ensure_checkpoint(args.checkpoint)
    from loadkit import open_checkpoint

    ck = open_checkpoint(args.checkpoint)
    if len(ck) < 500 or ck.total_bytes < 2**30:
        print(f"warning: {ck} is smaller than 1 GiB / 500 tensors", file=sys.stderr)
    warm_page_cache(args.checkpoint)
    runs = {}
    for behaviour in ("old", "new"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", behaviour, str(args.checkpoint)],
            check=True,
            capture_output=True,
            text=True,
        )
        runs[behaviour] = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps(runs[behaviour]))
    print(
        json.dumps(
            {
                "tensors": len(ck),
                "checkpoint_mb": round(ck.total_bytes / MiB, 1),
                "old_anon_mb": runs["old"]["anon_growth_mb"],
                "new_anon_mb": runs["new"]["anon_growth_mb"],
                "old_s": runs["old"]["seconds"],
                "new_s": runs["new"]["seconds"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
