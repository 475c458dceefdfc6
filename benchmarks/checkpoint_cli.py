"""The command line both checkpoint writers share: a preset by name, a seed, one file.

``benchmarks/gemma4_checkpoint.py`` and ``benchmarks/llama_checkpoint.py`` each describe their
model as a ``Writer`` (its presets, its layout, its writer); the parsing, the announcement and the
progress bar are here, once.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple


class Writer(NamedTuple):
    """One model's checkpoint writer, as the command line drives it."""

    model: str  # as printed: "Gemma4-like"
    presets: Mapping[str, Any]  # name -> config
    layout: Callable[[Any], Sequence[Any]]  # config -> its tensors (name, shape)
    nbytes: Callable[[Any], int]  # config -> bytes of data
    write: Callable[..., Path]  # (path, config, *, seed, progress) -> path

    def parser(self, script: str) -> argparse.ArgumentParser:
        """``OUT [--preset NAME] [--seed N]``; a writer may add options before parsing."""
        ap = argparse.ArgumentParser(
            prog=f"python benchmarks/{Path(script).name}",
            description=f"Write a {self.model} safetensors checkpoint, tensor by tensor, "
            "with progress.",
        )
        ap.add_argument("out", type=Path, help="the .safetensors file to write")
        ap.add_argument("--preset", choices=sorted(self.presets), default="bench")
        ap.add_argument("--seed", type=int, default=0)
        return ap

    def run(self, out: Path, config: Any, *, seed: int) -> int:
        """Say how many tensors and GiB ``config`` makes, then write them with a progress bar
        (memory stays at one tensor). Returns the exit status."""
        print(f"{len(self.layout(config))} tensors, {self.nbytes(config) / 2**30:.3f} GiB -> {out}")
        self.write(out, config, seed=seed, progress=True)
        return 0
