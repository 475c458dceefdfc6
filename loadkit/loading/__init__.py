"""Loading: the torch side of vLLM's weight-loading machinery.

``weight_loaders`` (``default_weight_loader``, ``composed_weight_loader``), ``auto_loader``
(``AutoWeightsLoader``), ``ledger`` (where every name went), ``counting`` (dispatch-mode counters,
``get_numel_loaded``), ``tensors`` (what a load fills, by qualified name) and ``meta``
(meta-device stand-ins). ``WeightsMapper`` itself is torch-free
and lives in ``loadkit.mapper``.
"""

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"
