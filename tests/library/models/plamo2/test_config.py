"""Plamo2's sizes: a tiny default with both mixers, the layer pattern ``mamba_step`` makes."""

import pytest

from loadkit.errors import LoadkitError
from loadkit.models.plamo2 import Plamo2Config


def test_default_config_is_tiny_with_both_mixers():
    config = Plamo2Config()
    assert config.layer_kinds == ["mamba", "attention"]
    assert Plamo2Config(num_hidden_layers=5, mamba_step=3).layer_kinds == [
        "mamba", "attention", "mamba", "mamba", "attention"
    ]  # fmt: skip
    # Fewer layers than half a step: only the last one attends (upstream's rule).
    assert Plamo2Config(num_hidden_layers=2, mamba_step=4).layer_kinds == ["mamba", "attention"]
    with pytest.raises(LoadkitError, match="mamba_step"):
        Plamo2Config(mamba_step=1)
