"""The padded mixture-of-experts model's sizes (``PaddedMoeConfig``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loadkit.errors import LoadkitError


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (vLLM's ``round_up``).

    >>> round_up(12, 16), round_up(2880, 64)
    (16, 2880)
    """
    return -(-n // multiple) * multiple


@dataclass
class PaddedMoeConfig:
    """Sizes of the model; the defaults pad each expert's 12 intermediate rows to 16.

    ``pad_multiple`` is what a kernel asks the intermediate size to be a multiple of (gpt-oss's
    mxfp4 experts pad 2880 to 2944; FlashInfer's TRT-LLM backend rounds to 128): the weights are
    created that large, and the checkpoint fills only the first ``intermediate_size`` rows.
    """

    vocab_size: int = 64
    hidden_size: int = 16
    num_hidden_layers: int = 2
    num_experts: int = 4
    num_experts_per_tok: int = 2
    intermediate_size: int = 12
    pad_multiple: int = 16
    rms_norm_eps: float = 1e-6
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise LoadkitError("num_experts_per_tok must be between 1 and num_experts")
        if self.pad_multiple < 1:
            raise LoadkitError("pad_multiple must be at least 1")

    @property
    def intermediate_padded(self) -> int:
        """Each expert's intermediate size as created: rounded up to ``pad_multiple``."""
        return round_up(self.intermediate_size, self.pad_multiple)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)
