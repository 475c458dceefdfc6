"""Tensor-parallel runs on real processes (the part of vLLM's executor that starts workers).

``launcher`` (``run_tensor_parallel``: ``tp`` rank processes on ``torch.distributed``),
``worker`` (what each rank runs), ``results`` (the plain records they hand back).
"""

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"
