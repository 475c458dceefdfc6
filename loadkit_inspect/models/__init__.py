"""What ``--model`` names: ``registry`` (the specs: built-in names, ``hf``, ``module:callable``),
``hf`` (a Hugging Face ``config.json`` read and built), ``vllm`` and ``vllm_registry`` (the class
vLLM 0.34.0 would serve a config with)."""

from loadkit_inspect.models.registry import BUILTIN, FROM_CONFIG

__all__ = ["BUILTIN", "FROM_CONFIG"]
