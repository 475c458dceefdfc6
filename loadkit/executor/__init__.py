"""Tensor-parallel runs on real processes (the part of vLLM's executor that starts workers).

``launcher`` (``run_tensor_parallel``: ``tp`` rank processes on ``torch.distributed``),
``worker`` (what each rank runs), ``results`` (the plain records they hand back).
"""
