"""The Gemma4-like sizes: the presets (the benchmarks' and one more), full scale, validation."""

import math

import pytest
import torch

from loadkit.checkpoint import dtypes
from loadkit.errors import LoadkitError
from loadkit.models import gemma4 as g4

from .cases import CONFIG_NAMES, G4


def test_every_config_is_tested(configs):
    assert sorted(CONFIG_NAMES) == sorted(configs)
    assert configs["small"] == g4.Gemma4Config()
    assert configs["full"] == g4.full_scale_config()


def test_bench_preset_is_what_the_memory_benchmark_needs(configs):
    # benchmarks/probe_memory.py: at least 500 tensors and 1 GiB, and the largest tensor a small
    # part of the whole (one clone against every clone).
    config = configs["bench"]
    layout = g4.checkpoint_layout(config)
    itemsize = dtypes.itemsize(dtypes.safetensors_dtype(config.dtype))
    largest = max(math.prod(shape) for _, shape in layout) * itemsize
    assert len(layout) >= 500 and g4.layout_bytes(config) >= 2**30
    assert largest * 60 <= g4.layout_bytes(config)


def test_full_scale_is_near_upstream():
    config = g4.full_scale_config()
    n = len(g4.checkpoint_layout(config))
    assert abs(n - 2011) <= 5
    assert abs(g4.layout_bytes(config) / 2**30 - 9.543) < 0.05
    with torch.device("meta"):
        model = G4(config)
    assert set(model.hf_to_vllm_mapper.orig_to_new_prefix) == {
        "model.language_model.",
        "model.vision_tower.",
        "model.audio_tower.",
    }


def test_config_validation():
    with pytest.raises(LoadkitError, match="num_hidden_layers"):
        g4.Gemma4Config(num_hidden_layers=0)
    with pytest.raises(LoadkitError, match="double_wide"):
        g4.Gemma4Config(num_hidden_layers=2, double_wide_mlp_layers=3)
    with pytest.raises(LoadkitError, match="vision tower"):
        g4.Gemma4Config(vision_layers=2)
    with pytest.raises(LoadkitError, match="dtype"):
        g4.Gemma4Config(dtype="float7")
    with pytest.raises(LoadkitError, match="hidden_size must be a non-negative int"):
        g4.Gemma4Config(hidden_size=-1)
