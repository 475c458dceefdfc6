"""Large Gemma4-like checkpoints for the benchmarks, written tensor by tensor with a progress bar.

    python benchmarks/gemma4_checkpoint.py data/big/g.safetensors --preset bench   # 1.06 GiB

Memory stays at one tensor, so a checkpoint larger than memory can be written. Values are those
of ``loadkit.models.gemma4.make_checkpoint`` (seeded by name), in any order of the names.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from checkpoint_cli import Writer  # beside this script

from loadkit.checkpoint.dtypes import safetensors_dtype
from loadkit.checkpoint.writer import write_safetensors
from loadkit.errors import LoadkitError
from loadkit.models.gemma4 import (
    Gemma4Config,
    checkpoint_layout,
    full_scale_config,
    layout_bytes,
    make_tensor,
)

# A checkpoint of at least 1 GiB with at least 500 tensors, for the memory benchmark. A small
# vocabulary keeps every tensor under 17 MB, so "one tensor" and "the whole checkpoint" differ
# by a factor of about 60.
BENCH_CONFIG = Gemma4Config(
    num_hidden_layers=30,
    hidden_size=1024,
    intermediate_size=5120,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    vocab_size=8192,
    hidden_size_per_layer_input=32,
    vocab_size_per_layer_input=8192,
)
PRESETS = {"small": Gemma4Config(), "bench": BENCH_CONFIG, "full": full_scale_config()}


def write_checkpoint(
    path: str | os.PathLike[str],
    config: Gemma4Config,
    *,
    seed: int = 0,
    order: Sequence[str] | None = None,
    progress: bool = False,
) -> Path:
    """Write a safetensors file tensor by tensor (memory stays at one tensor).

    ``order`` lays the data out in another order (a permutation of the names), for streams
    that do not start where sorted files do. ``progress`` shows a tqdm bar over bytes.
    """
    layout = dict(checkpoint_layout(config))
    names = list(layout)
    if order is not None:
        if sorted(order) != sorted(names):
            missing, extra = set(names) - set(order), set(order) - set(names)
            raise LoadkitError(
                f"write_checkpoint: order must name every tensor once; missing "
                f"{sorted(missing)[:3]}, unknown {sorted(extra)[:3]}"
            )
        names = list(order)
    dtype = safetensors_dtype(config.dtype)
    return write_safetensors(
        path,
        [(name, dtype, layout[name]) for name in names],
        lambda name: make_tensor(seed, name, layout[name], config.torch_dtype),
        metadata={"loadkit": "gemma4-like"},
        progress=progress,
    )


WRITER = Writer("Gemma4-like", PRESETS, checkpoint_layout, layout_bytes, write_checkpoint)


def main(argv: Sequence[str] | None = None) -> int:
    ap = WRITER.parser(__file__)
    ap.add_argument("--layers", type=int, help="num_hidden_layers (overrides the preset)")
    ap.add_argument("--hidden", type=int, help="hidden_size (overrides the preset)")
    args = ap.parse_args(argv)
    config = PRESETS[args.preset]
    if args.layers is not None:
        config = dataclasses.replace(
            config,
            num_hidden_layers=args.layers,
            double_wide_mlp_layers=min(config.double_wide_mlp_layers, args.layers),
        )
    if args.hidden is not None:
        config = dataclasses.replace(config, hidden_size=args.hidden)
    return WRITER.run(args.out, config, seed=args.seed)


if __name__ == "__main__":
    raise SystemExit(main())
