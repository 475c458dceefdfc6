"""200,000 names: ``loadkit inspect`` next to merely parsing the same header.

    python benchmarks/many_names.py            # both cases, 3 alternating runs each
    python benchmarks/many_names.py --runs 5

Two single-file checkpoints under ``data/big/many_names/`` (ignored by git), sparse (their tensor
bytes are holes), each with a header of about 20 MB:

1. ``tensors``: 200,000 tensors named like a deep model's (``model.layers.{i}.block{j}.weight``):
   the whole header-only ``loadkit inspect FILE`` process against a process that only
   ``json.loads`` the same header. Target: at most 3x.
2. ``unexpected``: 200,000 distinct top-level names against ``--model torch.nn:Module`` (a model
   with no parameters: every key is unexpected): the whole inspect process (build, dry load,
   report) against a process that ``json.loads`` the header and builds the same model (importing
   torch). Target: at most 3x.

The median of each side is kept (other work on the machine only ever adds time), of CPU time (user
+ system: ``ratio``) and of wall time (``wall_ratio``); a JSON line per case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from inspect_speed import write_sparse_safetensors
from large_layout import side_by_side

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "big" / "many_names"
N = 200_000

RAW_PARSE = r"""
import json, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
if len(sys.argv) > 2:
    import torch
    torch.nn.Module()
print(len(header))
"""


def write(path: Path, names: list[str]) -> Path:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_sparse_safetensors(path, {n: ("F32", [4], 4) for n in names})
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    py = sys.executable
    deep = write(OUT / "tensors.safetensors", [f"model.layers.{i // 10}.block{i % 10}.weight"
                                               for i in range(N)])  # fmt: skip
    flat = write(OUT / "unexpected.safetensors", [f"w{i}" for i in range(N)])
    cases = [
        (
            "tensors",
            [py, "-m", "loadkit_inspect", "inspect", str(deep)],
            [py, "-c", RAW_PARSE, str(deep)],
        ),
        (
            "unexpected",
            [py, "-m", "loadkit_inspect", "inspect", str(flat), "--model", "torch.nn:Module"],
            [py, "-c", RAW_PARSE, str(flat), "build"],
        ),
    ]
    for case, inspect_cmd, raw_cmd in cases:
        t = side_by_side(inspect_cmd, raw_cmd, args.runs)
        row = {"case": case, "names": N,
               "inspect_cpu_s": round(t.a_cpu_s, 3), "raw_cpu_s": round(t.b_cpu_s, 3),
               "ratio": round(t.a_cpu_s / t.b_cpu_s, 2),
               "inspect_s": round(t.a_s, 3), "raw_s": round(t.b_s, 3),
               "wall_ratio": round(t.a_s / t.b_s, 2),
               "load_average": round(os.getloadavg()[0], 2)}  # fmt: skip
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
