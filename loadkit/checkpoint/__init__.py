"""Checkpoints: safetensors files read header-first (``reader``, torch-free until tensors are
read) and written in a chosen order (``writer``). ``header`` reads a header as strictly as the
safetensors library does, in bounded memory; ``shards`` finds and safely opens the files a path
stands for; ``dtypes`` is the one dtype table.

>>> from loadkit.checkpoint import open_checkpoint  # also ``loadkit.open_checkpoint``
"""

from loadkit.checkpoint.reader import Checkpoint, TensorInfo, open_checkpoint

__all__ = ["Checkpoint", "TensorInfo", "open_checkpoint"]
