"""The Gemma4-like configurations the tests here share, and a header never written."""

import torch
from repo_paths import DATA

from loadkit.checkpoint.reader import TensorInfo
from loadkit.models import gemma4 as g4

GEMMA4_DATA = DATA / "gemma4_like" / "model.safetensors"

G4 = g4.Gemma4ForConditionalGeneration
# benchmarks/gemma4_checkpoint.py's presets (small, bench, full), and one more odd shape.
OWN_CONFIGS = {
    "no-ple-double-wide": g4.Gemma4Config(
        num_hidden_layers=3, hidden_size_per_layer_input=0, double_wide_mlp_layers=2
    ),
}
CONFIG_NAMES = ["small", "bench", "full", *OWN_CONFIGS]


def header_of(config):
    """``open_checkpoint(...).tensors`` of a checkpoint never written: header facts only."""
    out, offset = {}, 0
    for name, shape in g4.checkpoint_layout(config):
        n = 2 * torch.Size(shape).numel()
        out[name] = TensorInfo(name, "BF16", shape, n, "virtual.safetensors", offset)
        offset += n
    return out
