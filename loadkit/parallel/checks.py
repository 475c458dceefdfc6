"""What ``tp`` ranks make of a model's sizes, before anything is built: the checks vLLM's
layers and config make (heads and intermediate size divisible by ``tp``, kv heads split or
replicated evenly, the vocabulary padded to a multiple of 64 and split in equal slices)."""

from __future__ import annotations

from dataclasses import dataclass

from loadkit.parallel.vocab_parallel_embedding import (
    DEFAULT_VOCAB_PADDING_SIZE,
    pad_vocab_size,
    vocab_shard,
)


@dataclass(frozen=True)
class TPFinding:
    """One thing ``tp`` ranks would run into: ``severity`` is ``"error"`` or ``"note"``."""

    severity: str
    subject: str
    message: str


def size_findings(
    tp: int,
    *,
    heads: int,
    kv_heads: int,
    vocab_size: int | None,
    intermediate_size: int | None = None,
) -> list[TPFinding]:
    """``error`` findings cannot work (upstream refuses them too); ``note`` findings work but
    cost something (replicated kv heads, padded vocabulary rows). ``None``: a size not checked.

    Example:
        >>> [f.subject for f in size_findings(3, heads=4, kv_heads=2, vocab_size=64)]
        ['attention heads', 'kv heads', 'vocabulary']
        >>> [f.subject for f in size_findings(3, heads=4, kv_heads=4, vocab_size=None)]
        ['attention heads']
    """
    if tp < 1:
        return [TPFinding("error", "tp", f"tp must be at least 1, not {tp}")]
    out = _head_findings(tp, heads, kv_heads)
    if intermediate_size is not None and intermediate_size % tp:
        message = f"intermediate size {intermediate_size} is not divisible by tp={tp}"
        out.append(TPFinding("error", "intermediate size", message))
    if vocab_size is not None:
        out += _vocab_findings(tp, vocab_size)
    return out


def _head_findings(tp: int, heads: int, kv_heads: int) -> list[TPFinding]:
    """The attention heads split in ``tp`` equal parts, the kv heads split or replicated."""
    H, KV = heads, kv_heads
    out = []
    if H % tp:
        out.append(
            TPFinding(
                "error", "attention heads", f"{H} attention heads are not divisible by tp={tp}"
            )
        )
    if KV == H and H % tp:
        pass  # no grouped-query attention: the kv heads are the heads, already refused above
    elif KV >= tp and KV % tp:
        out.append(TPFinding("error", "kv heads", f"{KV} kv heads are not divisible by tp={tp}"))
    elif KV < tp and tp % KV:
        message = (
            f"tp={tp} is not a multiple of the {KV} kv heads: they cannot be replicated evenly"
        )
        out.append(TPFinding("error", "kv heads", message))
    elif KV < tp:
        message = (
            f"{KV} kv heads < tp={tp}: each kv head is replicated on {tp // KV} ranks "
            f"(rank r holds kv head r // {tp // KV})"
        )
        out.append(TPFinding("note", "kv replication", message))
    return out


def _vocab_findings(tp: int, vocab_size: int) -> list[TPFinding]:
    """The vocabulary padded to a multiple of 64, then split in ``tp`` equal slices."""
    padded = pad_vocab_size(vocab_size)
    if padded % tp:
        message = f"padded vocabulary {padded} is not divisible by tp={tp}"
        return [TPFinding("error", "vocabulary", message)]
    if padded == vocab_size:
        return []
    shards = [vocab_shard(vocab_size, r, tp) for r in range(tp)]
    # Computed from the sizes, as vocab_shard splits them: true whether or not a rank ran.
    pads = ", ".join(
        f"{s.padding_rows} on rank {r}" for r, s in enumerate(shards) if s.padding_rows
    )
    message = (
        f"vocabulary {vocab_size} padded to {padded} "
        f"(a multiple of {DEFAULT_VOCAB_PADDING_SIZE}): {padded // tp} rows per rank, of which "
        f"padding (zeros, nothing loaded into them): {pads}"
    )
    return [TPFinding("note", "vocab padding", message)]
