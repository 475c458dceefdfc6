"""Loading: the torch side of vLLM's weight-loading machinery.

``weight_loaders`` (``default_weight_loader``, ``composed_weight_loader``), ``auto_loader``
(``AutoWeightsLoader``), ``ledger`` (where every name went), ``counting`` (dispatch-mode counters,
``get_numel_loaded``), ``tensors`` (what a load fills, by qualified name), ``track`` (a finished
load as vLLM 0.34.0's loader judges it) and ``meta``
(meta-device stand-ins). ``WeightsMapper`` itself is torch-free
and lives in ``loadkit.mapper``. Their public names are this package's (``__all__``).
"""

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"

from loadkit.loading.auto_loader import AutoWeightsLoader
from loadkit.loading.counting import CloneCounter, CopyCounter, EagerDispatchMode, get_numel_loaded
from loadkit.loading.ledger import CheckpointEntry, LoadLedger, ParamEntry, ledger_of
from loadkit.loading.meta import meta_copy, meta_tensor, on_meta, to_meta
from loadkit.loading.observe import LoadObserver, current_observer, observing
from loadkit.loading.tensors import loadable_tensors, qualname
from loadkit.loading.track import (
    Tracked,
    exempt_parameters,
    forget_parts,
    missing_parts,
    track_weights_loading,
    weights_not_initialized,
)
from loadkit.loading.weight_loaders import (
    WeightLoader,
    composed_weight_loader,
    default_weight_loader,
    load_param,
    loader_of,
    set_weight_attrs,
)

__all__ = [
    "AutoWeightsLoader",
    "CheckpointEntry",
    "CloneCounter",
    "CopyCounter",
    "EagerDispatchMode",
    "LoadLedger",
    "LoadObserver",
    "ParamEntry",
    "Tracked",
    "WeightLoader",
    "composed_weight_loader",
    "current_observer",
    "default_weight_loader",
    "exempt_parameters",
    "forget_parts",
    "get_numel_loaded",
    "ledger_of",
    "load_param",
    "loadable_tensors",
    "loader_of",
    "meta_copy",
    "meta_tensor",
    "missing_parts",
    "observing",
    "on_meta",
    "qualname",
    "set_weight_attrs",
    "to_meta",
    "track_weights_loading",
    "weights_not_initialized",
]
