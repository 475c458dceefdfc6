"""Regenerate the small checkpoints committed in data/ (deterministic: fixed seeds).

    python data/generate.py            # rewrite every data/ checkpoint
    python data/generate.py --check    # fail if a committed file differs from a fresh one

Each model module owns its layout: ``write_data_checkpoints(out_dir) -> list[Path]`` writes the
files for that model under ``out_dir``. Larger checkpoints for benchmarks are made by the
benchmarks themselves, under data/big/ (ignored by git).
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
        bad = [
            p.relative_to(tmp)
            for p in generate(Path(tmp))
            if not filecmp.cmp(p, HERE / p.relative_to(tmp), shallow=False)
        ]
    for p in bad:
        print(f"differs from a fresh generation: data/{p}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
