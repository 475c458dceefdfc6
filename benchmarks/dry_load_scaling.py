"""Is `loadkit inspect --model` linear in the number of names? Time it at N and 4N names.

    python benchmarks/dry_load_scaling.py            # 1000 and 4000 names, best of 5
    python benchmarks/dry_load_scaling.py --names 2000 --runs 3

The report is built from headers alone (the tensors are ``TensorInfo``s, no file is read), with a
model of N/8 layers of four ``nn.Linear`` (8 tensors each) on the meta device, in four cases:

- ``clean``: the checkpoint's names are the model's;
- ``prefix``: every key under ``model.``, the model has none (every key unexpected, every tensor
  missing): the report pairs them all, infers the rule and simulates the load again with it;
- ``scattered``: one unknown name per layer besides the right ones (N/8 unknown names);
- ``hand-written``: a hand-written loop that raises ``KeyError`` for the unknown names of the
  ``scattered`` case (one discovery pass per failing key, then one full pass).

For each case the best CPU time (``time.process_time``: other jobs on a shared machine do not
count) at N and at 4N names is printed with their ratio: about 4 is linear
(the target: at most 6, allowing for noise), 16 would be quadratic. One JSON line per case.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

from loadkit import default_weight_loader
from loadkit.checkpoint.reader import Checkpoint, TensorInfo
from loadkit_inspect.inspector import inspect_checkpoint


class Stack(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.ModuleDict({p: nn.Linear(4, 4) for p in "abcd"}) for _ in range(layers)
        )


class HandWritten(Stack):
    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, w in weights:
            default_weight_loader(params[name], w)  # KeyError for a name it lacks


def checkpoint(names: list[tuple[str, tuple[int, ...]]]) -> Checkpoint:
    infos, offset = {}, 8
    for name, shape in names:
        nbytes = 4 * (shape[0] * (shape[1] if len(shape) > 1 else 1))
        infos[name] = TensorInfo(name, "F32", shape, nbytes, "bench.safetensors", offset)
        offset += nbytes
    return Checkpoint("bench.safetensors", ["bench.safetensors"], infos, {})


def model_names(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for i in range(layers):
        for p in "abcd":
            out += [(f"layers.{i}.{p}.weight", (4, 4)), (f"layers.{i}.{p}.bias", (4,))]
    return out


def case(name: str, layers: int) -> tuple[Checkpoint, type[nn.Module]]:
    names = model_names(layers)
    if name == "clean":
        return checkpoint(names), Stack
    if name == "prefix":
        return checkpoint([("model." + n, s) for n, s in names]), Stack
    scattered = []
    for i in range(layers):
        scattered += [*names[8 * i : 8 * i + 8], (f"layers.{i}.extra_{i}", (4,))]
    return checkpoint(scattered), Stack if name == "scattered" else HandWritten


def best(ck: Checkpoint, cls: type[nn.Module], layers: int, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.process_time()  # CPU time: the machine is shared, wall time is not ours
        inspect_checkpoint(ck, model=lambda: cls(layers)).render()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=1000, help="N (the model's tensors)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    small = args.names // 8
    for name in ("clean", "prefix", "scattered", "hand-written"):
        row = {"case": name}
        for label, layers in (("n", small), ("4n", 4 * small)):
            ck, cls = case(name, layers)
            row[f"names_{label}"] = len(ck.tensors)
            row[f"s_{label}"] = round(best(ck, cls, layers, args.runs), 3)
        row["ratio"] = round(row["s_4n"] / row["s_n"], 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
