"""Checkpoints: safetensors files read header-first (``reader``, torch-free until tensors are
read) and written in a chosen order (``writer``).

>>> from loadkit.checkpoint import open_checkpoint  # also ``loadkit.open_checkpoint``
"""

from loadkit.checkpoint.reader import Checkpoint, TensorInfo, open_checkpoint

__all__ = ["Checkpoint", "TensorInfo", "open_checkpoint"]
