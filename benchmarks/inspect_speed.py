"""How fast is `loadkit inspect`, next to merely parsing the same headers?

    python benchmarks/inspect_speed.py            # both checkpoints, 15 runs each
    python benchmarks/inspect_speed.py --runs 31

Two checkpoints are written under data/big/inspect_speed/ (ignored by git), both sparse files
(their tensor bytes are holes: they take no disk space and are never read):

- ``sparse64.safetensors``: 64 float32 tensors of 1 GiB each, 64 GiB on paper;
- ``index2k/``: a sharded checkpoint with ``model.safetensors.index.json`` naming 2000+ tensors
  (a Mixtral-like layout: 64 layers of attention, norms and 8 experts) over 8 shards.

For each, the whole `loadkit inspect PATH` process (interpreter start, imports, header
parsing and validation, the layout tree, the printed report) is timed against a plain Python
process that only opens the same files and ``json.loads`` their headers (and the index). Runs
alternate and the median is kept; one warm-up run each first, with bytecode caching on, so both
start from the same warm state. Each process's CPU time (user + system) is measured beside its
wall time: the machine is shared, and another job's turn on a core adds wall time but no CPU
time. A line per checkpoint, then a last line of JSON over both: ``{"tensors": N,
"inspect_cpu_s": A, "raw_parse_cpu_s": B, "ratio": A/B, "wall_ratio": ..., "load_average":
...}``. Target: ratio (of CPU times) at most 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 2.0  # inspect's whole process against a plain parse of the same headers
# What tests/tool/cli/test_main_speed.py asserts: the CPU-time ratio is 1.89 to 1.92 over 21 runs,
# but the test's 7 runs gave up to 1.98 under load (docs/benchmarks.md), too close to the target
# to assert it; this bound fails the 2.3 of dataclasses on the header path.
ASSERTED_RATIO = 2.2
OUT = ROOT / "data" / "big" / "inspect_speed"
GIB = 1 << 30

# Reads what the inspector reads, and nothing else: the index (if any) and each shard's header.
RAW_PARSE = r"""
import json, os, sys
path = sys.argv[1]
files = [path]
if os.path.isdir(path):
    index = json.loads(open(os.path.join(path, "model.safetensors.index.json")).read())
    files = [os.path.join(path, f) for f in sorted(set(index["weight_map"].values()))]
n = 0
for file in files:
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        n += sum(k != "__metadata__" for k in json.loads(f.read(size)))
print(n)
"""


def write_sparse_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> int:
    """Write a valid safetensors file whose data region is a hole; returns its size on paper.

    ``tensors``: name -> (dtype, shape, bytes per element).
    """
    header: dict[str, object] = {}
    offset = 0
    for name, (dtype, shape, itemsize) in tensors.items():
        n = itemsize
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # safetensors pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + offset)  # extend without writing: a sparse file
    return 8 + len(blob) + offset


def make_sparse64(out: Path) -> Path:
    """64 float32 tensors of 1 GiB ([16384, 16384]) in one file: 64 GiB on paper."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sparse64.safetensors"
    tensors = {
        f"model.layers.{i // 4}.mlp.{('gate', 'up', 'down', 'extra')[i % 4]}_proj.weight": (
            "F32",
            [16384, 16384],
            4,
        )
        for i in range(64)
    }
    write_sparse_safetensors(path, tensors)
    return path


def mixtral_like_names(layers: int = 64, experts: int = 8) -> list[tuple[str, list[int]]]:
    h, inter, kv = 4096, 14336, 1024  # Mixtral-8x7B's sizes, with twice its layers
    names: list[tuple[str, list[int]]] = [("model.embed_tokens.weight", [32000, h])]
    for i in range(layers):
        p = f"model.layers.{i}"
        names += [
            (f"{p}.input_layernorm.weight", [h]),
            (f"{p}.self_attn.q_proj.weight", [h, h]),
            (f"{p}.self_attn.k_proj.weight", [kv, h]),
            (f"{p}.self_attn.v_proj.weight", [kv, h]),
            (f"{p}.self_attn.o_proj.weight", [h, h]),
            (f"{p}.self_attn.rotary_emb.inv_freq", [64]),  # older checkpoints still carry it
            (f"{p}.post_attention_layernorm.weight", [h]),
            (f"{p}.block_sparse_moe.gate.weight", [experts, h]),
        ]
        for e in range(experts):
            q = f"{p}.block_sparse_moe.experts.{e}"
            names += [
                (f"{q}.w1.weight", [inter, h]),
                (f"{q}.w2.weight", [h, inter]),
                (f"{q}.w3.weight", [inter, h]),
            ]
    names += [("model.norm.weight", [h]), ("lm_head.weight", [32000, h])]
    return names


def make_index2k(out: Path, shards: int = 8) -> Path:
    """A sharded bf16 checkpoint of 2000+ names with its index; shard data are holes."""
    folder = out / "index2k"
    folder.mkdir(parents=True, exist_ok=True)
    names = mixtral_like_names()
    per = -(-len(names) // shards)
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s * per : (s + 1) * per]
        write_sparse_safetensors(folder / file, {n: ("BF16", shape, 2) for n, shape in part})
        total += sum(2 * math.prod(shape) for _, shape in part)  # tensor bytes, as HF counts
        weight_map.update(dict.fromkeys((n for n, _ in part), file))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    assert len(weight_map) >= 2000, len(weight_map)
    return folder


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's Python caches bytecode; so do we
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, of the child alone) of one run of ``cmd``; its
    output is dropped (stderr too: never a terminal, so never a progress bar)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(path: Path, runs: int) -> dict[str, float | int | str]:
    env = _env()
    inspect_cmd = [sys.executable, "-m", "loadkit_inspect", "inspect", str(path)]
    raw_cmd = [sys.executable, "-c", RAW_PARSE, str(path)]
    out = subprocess.run(raw_cmd, env=env, capture_output=True, text=True, check=True)
    tensors = int(out.stdout)
    subprocess.run(inspect_cmd, env=env, capture_output=True, check=True)  # it runs; warm-up
    a: list[tuple[float, float]] = []
    b: list[tuple[float, float]] = []
    for _ in range(runs):
        a.append(timed(inspect_cmd, env))
        b.append(timed(raw_cmd, env))
    # The median, not the mean: other work on the machine only ever adds time.
    inspect_s, raw_s = (statistics.median(w for w, _ in x) for x in (a, b))
    inspect_cpu, raw_cpu = (statistics.median(c for _, c in x) for x in (a, b))
    return {
        "case": path.name,
        "tensors": tensors,
        "inspect_cpu_s": round(inspect_cpu, 4),
        "raw_parse_cpu_s": round(raw_cpu, 4),
        "ratio": round(inspect_cpu / raw_cpu, 3),
        "inspect_s": round(inspect_s, 4),
        "raw_parse_s": round(raw_s, 4),
        "wall_ratio": round(inspect_s / raw_s, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    cases = [make_sparse64(OUT), make_index2k(OUT)]
    results = [measure(p, args.runs) for p in cases]
    for r in results:
        print(json.dumps(r))
    inspect_s, raw_s, inspect_cpu, raw_cpu = (
        sum(float(r[k]) for r in results)
        for k in ("inspect_s", "raw_parse_s", "inspect_cpu_s", "raw_parse_cpu_s")
    )
    total = {
        "tensors": sum(int(r["tensors"]) for r in results),
        "inspect_cpu_s": round(inspect_cpu, 4),
        "raw_parse_cpu_s": round(raw_cpu, 4),
        "ratio": round(inspect_cpu / raw_cpu, 3),
        "wall_ratio": round(inspect_s / raw_s, 3),
        "load_average": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(total))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
