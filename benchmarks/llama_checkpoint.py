"""Llama-like checkpoints for the benchmarks, written tensor by tensor with a progress bar.

    python benchmarks/llama_checkpoint.py data/big/llama_like_bench.safetensors --preset bench

Memory stays at one tensor. Values are those of ``loadkit.models.llama.make_checkpoint``
(seeded by name); ``benchmarks/tp_memory.py`` writes its checkpoint through here.
"""

from __future__ import annotations

from collections.abc import Sequence

from checkpoint_cli import Writer  # beside this script

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


WRITER = Writer("Llama-like", PRESETS, checkpoint_layout, layout_bytes, write_checkpoint)


def main(argv: Sequence[str] | None = None) -> int:
    args = WRITER.parser(__file__).parse_args(argv)
    return WRITER.run(args.out, PRESETS[args.preset], seed=args.seed)


if __name__ == "__main__":
    raise SystemExit(main())
