"""Llama-like checkpoints for the benchmarks, written tensor by tensor with a progress bar.

    python benchmarks/llama_checkpoint.py data/big/llama_like_bench.safetensors --preset bench

Memory stays at one tensor. Values are those of ``loadkit.models.llama.make_checkpoint``
(seeded by name); ``benchmarks/tp_memory.py`` writes its checkpoint through here.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from loadkit.models.llama import LlamaLikeConfig, checkpoint_layout, layout_bytes, write_checkpoint

PRESETS = {
    "tiny": LlamaLikeConfig(),
    # About 1 GiB in float32 (258 tensors, the largest the 32 MiB vocabulary tables): the memory
    # benchmark's checkpoint.
    "bench": LlamaLikeConfig(
        vocab_size=8192,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=17,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        attention_bias=True,
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/llama_checkpoint.py",
        description="Write a Llama-like safetensors checkpoint, tensor by tensor, with progress.",
    )
    ap.add_argument("out", type=Path, help="the .safetensors file to write")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="bench")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    config = PRESETS[args.preset]
    n = len(checkpoint_layout(config))
    print(f"{n} tensors, {layout_bytes(config) / 2**30:.3f} GiB -> {args.out}")
    write_checkpoint(args.out, config, seed=args.seed, progress=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
