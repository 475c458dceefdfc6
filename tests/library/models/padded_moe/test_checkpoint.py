"""The padded MoE's checkpoint: the committed files are the generator's."""

from __future__ import annotations

import torch
from repo_paths import DATA

from loadkit import open_checkpoint
from loadkit.models.padded_moe import make_checkpoint


def test_the_committed_checkpoints_are_the_generator_s():
    for name, seed in (("initial", 0), ("update", 1)):
        ckpt = open_checkpoint(DATA / "padded_moe" / f"{name}.safetensors")
        assert dict(ckpt.weights()).keys() == make_checkpoint(seed=seed).keys()
        for key, tensor in ckpt.weights():
            assert torch.equal(tensor, make_checkpoint(seed=seed)[key]), key
