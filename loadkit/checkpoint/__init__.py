"""Checkpoints: safetensors files read header-first (``reader``, torch-free until tensors are
read) and written in a chosen order (``writer``). ``header`` reads a header as strictly as the
safetensors library does, in bounded memory; ``shards`` finds and safely opens the files a path
stands for (a ``Layout``); ``merge`` reads a layout's shards into one checkpoint, strictly or
collecting every problem; ``dtypes`` is the one dtype table.

>>> from loadkit.checkpoint import open_checkpoint  # also ``loadkit.open_checkpoint``
"""

from loadkit.checkpoint.dtypes import DTYPES
from loadkit.checkpoint.header import TensorInfo
from loadkit.checkpoint.merge import IndexProblem, Merged, read_layout
from loadkit.checkpoint.reader import (
    Checkpoint,
    open_checkpoint,
    read_header_ranges,
    read_safetensors_header,
)
from loadkit.checkpoint.shards import (
    INDEX_NAME,
    MAX_INDEX_BYTES,
    Layout,
    index_entries,
    local_layout,
    open_regular,
    parse_index,
    single_file_beside_index,
)

__all__ = [
    "DTYPES",
    "INDEX_NAME",
    "MAX_INDEX_BYTES",
    "Checkpoint",
    "IndexProblem",
    "Layout",
    "Merged",
    "TensorInfo",
    "index_entries",
    "local_layout",
    "open_checkpoint",
    "open_regular",
    "parse_index",
    "read_header_ranges",
    "read_layout",
    "read_safetensors_header",
    "single_file_beside_index",
]
