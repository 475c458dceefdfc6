"""``loadkit inspect``: a checkpoint checked against a model before any load.

The tool on top of the library (``loadkit``): ``sources`` (what a checkpoint argument names,
read leniently), ``models`` (what ``--model`` names), ``simulate`` (the load on the meta device),
``tensor_parallel`` (``--tp``), ``fixes`` (suggested mapper rules, proven), ``report`` (its
records and text), ``cli`` (the ``loadkit`` command) and ``inspector``, the pipeline.
Torch-free, so that a header-only inspect of a 100 GB checkpoint starts in milliseconds:
``simulate`` and ``tensor_parallel`` import torch and are imported only when asked for.

>>> from loadkit_inspect import inspect_checkpoint
>>> inspect_checkpoint("data/plamo2/untied.safetensors", model="plamo2").exit_status
0
"""

from loadkit_inspect.inspect_report import InspectReport
from loadkit_inspect.inspector import inspect_checkpoint

__all__ = ["InspectReport", "inspect_checkpoint"]
