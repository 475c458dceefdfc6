"""Regenerate the small checkpoints committed in data/ (deterministic: fixed seeds).

    python data/generate.py            # rewrite every data/ checkpoint
    python data/generate.py --check    # fail if a committed file differs from a fresh one
    ATEN_CPU_CAPABILITY=default python data/generate.py --check  # with torch's plain kernels

Each model module owns its layout: ``write_data_checkpoints(out_dir) -> list[Path]`` writes the
files for that model under ``out_dir``. Larger checkpoints for benchmarks are made by the
benchmarks themselves, under data/big/ (ignored by git).

The values are the same bits on every machine (``loadkit.models.dyadic``): integers from seeded
generators scaled by powers of two, and functions of them computed in decimal arithmetic and
rounded once; no torch float kernel, whose last bits vary by CPU family, is involved.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = [
    "loadkit.models.gemma4",
    "loadkit.models.plamo2",
    "loadkit.models.nemotron_h",
    "loadkit.models.llama",
]


def generate(out_dir: Path) -> list[Path]:
    written: list[Path] = []
    for name in MODELS:
        module = importlib.import_module(name)
        written += module.write_data_checkpoints(out_dir)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    if not args.check:
        for p in generate(HERE):
            print(p.relative_to(HERE), p.stat().st_size, "bytes")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = [p.relative_to(tmp) for p in generate(Path(tmp))]
        bad = [
            p
            for p in fresh
            if not (HERE / p).is_file() or not filecmp.cmp(Path(tmp) / p, HERE / p, shallow=False)
        ]
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    for p in bad:
        print(f"differs from a fresh generation: data/{p}", file=sys.stderr)
    if bad:
        print(f"(torch CPU capability: {capability})", file=sys.stderr)
        return 1
    print(
        f"data/: {len(fresh)} files byte-identical to a fresh generation "
        f"(torch CPU capability: {capability})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
