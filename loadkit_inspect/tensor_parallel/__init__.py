"""``loadkit inspect --tp N``: every rank's share computed on the meta device, without processes.

``share`` (one rank's share: the model built in a stand-in group and loaded with meta tensors),
``rowmap`` (which checkpoint rows each rank takes, as a table), ``plan`` (the report's ``--tp``
section). Imports torch, like ``simulate``, and only when ``--tp`` is given.
"""

from loadkit_inspect.tensor_parallel.rowmap import render_row_map, row_map

__all__ = ["render_row_map", "row_map"]
