"""How fast is `loadkit inspect PATH --model hf`, next to the least it could cost?

    python benchmarks/inspect_hf_speed.py            # 7 runs each, alternating
    python benchmarks/inspect_hf_speed.py --runs 15

Writes under data/big/inspect_hf_speed/ (ignored by git) a checkpoint of Llama-2-7B's layout:
``LlamaConfig()``'s defaults (32 layers, hidden 4096, vocab 32000), its ``config.json`` saved by
transformers, and one sparse bf16 safetensors file with every tensor of ``LlamaForCausalLM``
(291 tensors, 12.6 GiB on paper: the data region is a hole, never written or read).

Three processes are timed, alternating, each from a warm start (one warm-up run first):

- ``hf``: the whole ``loadkit inspect PATH --model hf`` (imports, config, the model
  built by transformers on the meta device, the simulated load, the printed report);
- ``floor``: a plain process that imports torch and transformers and builds the same model with
  ``AutoModel.from_config`` on the meta device: what any tool using transformers' own classes
  pays before it looks at a single name;
- ``header``: ``loadkit inspect PATH`` without a model (header-only, torch-free).

Printed: wall and CPU (user+sys) medians of each, the ratio hf/floor, and where one ``hf`` run
spends its time (``--phases``: imports, building, the simulated load and report, measured
in-process). A last line of JSON: ``{"hf_s", "floor_s", "header_s", "ratio", "hf_cpu_s",
"floor_cpu_s"}``. The machine is shared: CPU times are steadier than wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "big" / "inspect_hf_speed"

FLOOR = r"""
import sys, torch
from transformers import AutoConfig, AutoModel
config = AutoConfig.from_pretrained(sys.argv[1])
with torch.device("meta"):
    AutoModel.from_config(config)
"""

PHASES = r"""
import sys, time, json
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import transformers, transformers.modeling_utils
t2 = time.perf_counter()
from loadkit_inspect import inspect_checkpoint
report = inspect_checkpoint(sys.argv[1], model="hf")
t3 = time.perf_counter()
text = report.render()
t4 = time.perf_counter()
print(json.dumps({"import_torch_s": round(t1 - t0, 3), "import_transformers_s": round(t2 - t1, 3),
                  "build_and_dry_load_s": round(t3 - t2, 3), "render_s": round(t4 - t3, 3),
                  "tensors": len(report.checkpoint.tensors), "clean": report.clean}))
"""


def make_llama7b(out: Path) -> Path:
    """Llama-2-7B's layout as a sparse checkpoint with its config.json (written once)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from inspect_speed import write_sparse_safetensors

    folder = out / "llama-2-7b-layout"
    if (folder / "model.safetensors").exists() and (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(dtype="bfloat16", architectures=["LlamaForCausalLM"])
    config.save_pretrained(folder)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    tensors = {name: ("BF16", list(t.shape), 2) for name, t in sorted(model.state_dict().items())}
    write_sparse_safetensors(folder / "model.safetensors", tensors)
    return folder


def timed(argv: list[str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall and CPU (user+sys, the child's) seconds of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--phases", action="store_true", help="also time one run's phases")
    args = parser.parse_args()
    folder = make_llama7b(OUT)
    py = sys.executable
    commands = {
        "hf": [py, "-m", "loadkit_inspect", "inspect", str(folder), "--model", "hf"],
        "floor": [py, "-c", FLOOR, str(folder)],
        "header": [py, "-m", "loadkit_inspect", "inspect", str(folder)],
    }
    for argv in commands.values():  # warm-up: bytecode caches, page cache
        _, _, res = timed(argv)
    res = timed(commands["hf"])[2]
    if res.returncode != 0 or "verdict: would load cleanly" not in res.stdout:
        print(res.stdout[-2000:], res.stderr[-2000:], file=sys.stderr)
        return 1
    walls: dict[str, list[float]] = {k: [] for k in commands}
    cpus: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(args.runs):
        for name, argv in commands.items():
            wall, cpu, res = timed(argv)
            if res.returncode != 0:
                print(res.stderr[-2000:], file=sys.stderr)
                return 1
            walls[name].append(wall)
            cpus[name].append(cpu)
    med = {k: statistics.median(v) for k, v in walls.items()}
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    for name in commands:
        print(
            f"{name:>6}: wall median {med[name]:.3f} s (min {min(walls[name]):.3f}), "
            f"cpu median {cpu[name]:.3f} s"
        )
    if args.phases:
        res = subprocess.run([py, "-c", PHASES, str(folder)], capture_output=True, text=True)
        print("phases of one hf run (in-process):", res.stdout.strip() or res.stderr[-500:])
    print(f"load average: {os.getloadavg()[0]:.2f} (2 cores shared)")
    print(
        json.dumps(
            {
                "hf_s": round(med["hf"], 3),
                "floor_s": round(med["floor"], 3),
                "header_s": round(med["header"], 3),
                "ratio": round(med["hf"] / med["floor"], 3),
                "hf_cpu_s": round(cpu["hf"], 3),
                "floor_cpu_s": round(cpu["floor"], 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
