"""Regenerate the small checkpoints committed in data/ (deterministic: fixed seeds).

    python data/generate.py            # rewrite every data/ checkpoint
    python data/generate.py --check    # fail if a committed file differs from a fresh one
    ATEN_CPU_CAPABILITY=default python data/generate.py --check  # with torch's plain kernels

One writer per model below, each ``writer(out_dir) -> list[Path]`` writing that model's files
under ``out_dir``: the data layout lives here, the models' own modules only know how to make
a checkpoint's tensors (``make_checkpoint``). Larger checkpoints for benchmarks are made by the
benchmarks themselves, under data/big/ (ignored by git).

The values are the same bits on every machine (``loadkit.models.dyadic``): integers from seeded
generators scaled by powers of two, and functions of them computed in decimal arithmetic and
rounded once; no torch float kernel, whose last bits vary by CPU family, is involved.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def gemma4_like(out_dir: Path) -> list[Path]:
    """``gemma4_like/model.safetensors``: the default config, seed 0, in layout order."""
    from loadkit.checkpoint.writer import save_in_order
    from loadkit.models.gemma4 import Gemma4Config, make_checkpoint

    path = Path(out_dir) / "gemma4_like" / "model.safetensors"
    tensors = make_checkpoint(Gemma4Config(), seed=0)
    return [save_in_order(path, tensors, metadata={"loadkit": "gemma4-like"})]


def plamo2(out_dir: Path) -> list[Path]:
    """Write the committed checkpoints under ``out_dir/plamo2``; return every file written.

    - ``untied.safetensors``: untied config, with ``lm_head.weight``;
    - ``tied.safetensors``: tied config, without it, as published tied checkpoints are;
    - ``tied-with-lm-head/``: the tied checkpoint plus ``lm_head.weight`` in a second shard (as in
      a sharded export, where it streams after the embedding), with an index.
    """
    from safetensors.torch import save_file

    from loadkit.models.plamo2 import Plamo2Config, make_checkpoint

    root = Path(out_dir) / "plamo2"
    root.mkdir(parents=True, exist_ok=True)
    meta = {"format": "pt"}
    written = []
    untied = make_checkpoint(Plamo2Config(tie_word_embeddings=False), seed=0)
    save_file(untied, root / "untied.safetensors", metadata=meta)
    written.append(root / "untied.safetensors")
    tied_cfg = Plamo2Config(tie_word_embeddings=True)
    tied = make_checkpoint(tied_cfg, seed=1)
    save_file(tied, root / "tied.safetensors", metadata=meta)
    written.append(root / "tied.safetensors")

    shards = root / "tied-with-lm-head"
    shards.mkdir(exist_ok=True)
    with_head = make_checkpoint(tied_cfg, seed=1, include_lm_head=True)
    head = {"lm_head.weight": with_head.pop("lm_head.weight")}
    files = {
        "model-00001-of-00002.safetensors": with_head,
        "model-00002-of-00002.safetensors": head,
    }
    weight_map = {}
    for fname, tensors in files.items():
        save_file(tensors, shards / fname, metadata=meta)
        written.append(shards / fname)
        weight_map.update(dict.fromkeys(tensors, fname))
    index = shards / "model.safetensors.index.json"
    total = sum(t.numel() * t.element_size() for t in {**with_head, **head}.values())
    body = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    index.write_text(json.dumps(body, indent=2) + "\n")
    written.append(index)
    return written


def nemotron_h(out_dir: Path) -> list[Path]:
    """``nemotron_h/initial.safetensors`` (seed 0) and one update (seed 1) per order.

    The files keep the key order in their data (safetensors' own writer sorts by name), so a
    streaming load sees exactly the order the reload story is about.
    """
    from loadkit.checkpoint.writer import save_in_order
    from loadkit.models.nemotron_h import ORDERS, NemotronHConfig, make_checkpoint

    folder = Path(out_dir) / "nemotron_h"
    folder.mkdir(parents=True, exist_ok=True)
    c = NemotronHConfig()
    written = [
        save_in_order(
            folder / "initial.safetensors",
            make_checkpoint(c, seed=0),
            metadata={"seed": "0", "order": "d-last"},
        )
    ]
    for order in ORDERS:
        written.append(
            save_in_order(
                folder / f"update-{order}.safetensors",
                make_checkpoint(c, seed=1, order=order),
                metadata={"seed": "1", "order": order},
            )
        )
    return written


def llama_like(out_dir: Path) -> list[Path]:
    """``llama_like/model.safetensors``: the default config, seed 0, written tensor by tensor."""
    from loadkit.models.llama import LlamaLikeConfig, write_checkpoint

    path = Path(out_dir) / "llama_like" / "model.safetensors"
    return [write_checkpoint(path, LlamaLikeConfig())]


def vision_tower(out_dir: Path) -> list[Path]:
    """``vision_tower/model.safetensors``: the default config, seed 0, q/k/v apart, by name."""
    from loadkit.checkpoint.writer import save_in_order
    from loadkit.models.vision_tower import VisionTowerConfig, make_checkpoint

    path = Path(out_dir) / "vision_tower" / "model.safetensors"
    tensors = make_checkpoint(VisionTowerConfig(), seed=0)
    return [save_in_order(path, tensors, metadata={"loadkit": "vision-tower"})]


def padded_moe(out_dir: Path) -> list[Path]:
    """``padded_moe/initial.safetensors`` (seed 0) and ``update.safetensors`` (seed 1): the
    experts at their unpadded size, in layer order."""
    from loadkit.checkpoint.writer import save_in_order
    from loadkit.models.padded_moe import PaddedMoeConfig, make_checkpoint

    folder = Path(out_dir) / "padded_moe"
    folder.mkdir(parents=True, exist_ok=True)
    c = PaddedMoeConfig()
    return [
        save_in_order(
            folder / f"{name}.safetensors",
            make_checkpoint(c, seed=seed),
            metadata={"seed": str(seed), "loadkit": "padded-moe"},
        )
        for name, seed in (("initial", 0), ("update", 1))
    ]


WRITERS = {
    "gemma4_like": gemma4_like,
    "plamo2": plamo2,
    "nemotron_h": nemotron_h,
    "llama_like": llama_like,
    "vision_tower": vision_tower,
    "padded_moe": padded_moe,
}


def generate(out_dir: Path) -> list[Path]:
    written: list[Path] = []
    for writer in WRITERS.values():
        written += writer(out_dir)
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
