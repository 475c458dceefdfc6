"""The unquantized ``quant_method`` every vLLM layer carries (``UnquantizedLinearMethod``,
``UnquantizedEmbeddingMethod``, ``UnquantizedFusedMoEMethod``).

loadkit quantizes nothing; the attribute is there because vLLM's loader reads it. After a load,
vLLM 0.34.0's ``track_weights_loading`` counts every parameter of a module whose
``quant_method`` has a ``process_weights_after_loading`` as loaded, on an unquantized model too:
a linear, embedding or expert weight the checkpoint never filled raises nothing and stays
uninitialised (``loadkit.loading.track``).

>>> hasattr(UnquantizedLinearMethod(), "process_weights_after_loading")
True
"""

from __future__ import annotations

from torch import nn


class QuantizeMethodBase:
    """What a layer's ``quant_method`` offers to the loader: a hook run after loading."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Nothing to convert on an unquantized layer."""


class UnquantizedLinearMethod(QuantizeMethodBase):
    """The ``quant_method`` of an unquantized linear layer."""


class UnquantizedEmbeddingMethod(QuantizeMethodBase):
    """The ``quant_method`` of an unquantized vocabulary embedding or LM head."""


class UnquantizedFusedMoEMethod(QuantizeMethodBase):
    """The ``quant_method`` of unquantized routed experts."""
