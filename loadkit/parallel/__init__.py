"""Tensor parallelism: vLLM's parallel layers and their weight loaders.

``state`` (the process group), ``linear`` and ``vocab_parallel_embedding`` (the layers, in
modules named as vLLM's), ``param_loaders`` (where a rank narrows a checkpoint tensor),
``holdings`` (which checkpoint rows each parameter got, read from the copies the loaders make).
Running ``tp`` real processes is ``loadkit.executor``'s job; one rank's share on the meta device,
for ``inspect --tp``, is ``loadkit_inspect.tensor_parallel``'s.
"""

from loadkit.errors import require_torch

require_torch(__name__)  # one line naming the extra, not "No module named torch"

from loadkit.parallel.checks import TPFinding, size_findings
from loadkit.parallel.holdings import CopyRecord, HoldingsRecorder, Span
from loadkit.parallel.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from loadkit.parallel.state import (
    NotDivisibleError,
    TensorParallelError,
    TPGroup,
    divide,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
    stand_in_group,
    use_group,
)
from loadkit.parallel.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
    pad_vocab_size,
    vocab_shard,
)

__all__ = [
    "ColumnParallelLinear",
    "CopyRecord",
    "HoldingsRecorder",
    "MergedColumnParallelLinear",
    "NotDivisibleError",
    "ParallelLMHead",
    "QKVParallelLinear",
    "RowParallelLinear",
    "Span",
    "TPFinding",
    "TPGroup",
    "TensorParallelError",
    "VocabParallelEmbedding",
    "divide",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
    "get_tp_group",
    "pad_vocab_size",
    "size_findings",
    "stand_in_group",
    "use_group",
    "vocab_shard",
]
