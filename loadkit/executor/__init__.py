"""Tensor-parallel runs on real processes (the part of vLLM's executor that starts workers).

``launcher`` (``run_tensor_parallel``: ``tp`` rank processes on ``torch.distributed``),
``worker`` (what each rank runs), ``results`` (the plain records they hand back).
"""

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"

from loadkit.executor.launcher import run_tensor_parallel
from loadkit.executor.results import BUGS, Fault, Job, RankResult, TPRun

__all__ = ["BUGS", "Fault", "Job", "RankResult", "TPRun", "run_tensor_parallel"]
