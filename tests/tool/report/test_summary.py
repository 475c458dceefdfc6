"""The checkpoint section's totals per file and per dtype, whatever order the tensors come in."""

from __future__ import annotations

from loadkit.checkpoint.reader import Checkpoint, TensorInfo
from loadkit_inspect.report.summary import ShardSummary, summarize_checkpoint


def info(name: str, dtype: str, nbytes: int, file: str) -> TensorInfo:
    return TensorInfo(name, dtype, (nbytes,), nbytes, file, 8)


def test_files_interleaved_and_unlisted_are_summed_per_file_and_dtype():
    # Shards in stream order, then a file that comes back after another, a file the
    # checkpoint does not list, and a listed file that holds nothing.
    tensors = [
        info("a", "F32", 4, "one"),
        info("b", "BF16", 2, "one"),
        info("c", "F32", 8, "two"),
        info("d", "F32", 16, "one"),
        info("e", "U8", 1, "elsewhere"),
        info("f", "BF16", 32, "two"),
    ]
    ck = Checkpoint("ck", ["one", "two", "empty"], {t.name: t for t in tensors}, {})
    s = summarize_checkpoint(ck)
    assert s.files == [
        ShardSummary("one", 3, 22),
        ShardSummary("two", 2, 40),
        ShardSummary("empty", 0, 0),
        ShardSummary("elsewhere", 1, 1),
    ]
    assert s.dtypes == {"BF16": (2, 34), "F32": (3, 28), "U8": (1, 1)}
    assert list(s.dtypes) == ["BF16", "F32", "U8"]
    assert s.total_bytes == 63 == ck.total_bytes
    assert [t.name for t in s.tensors] == list("abcdef")


def test_an_empty_checkpoint_sums_to_nothing():
    s = summarize_checkpoint(Checkpoint("ck", ["one"], {}, {}))
    assert s.files == [ShardSummary("one", 0, 0)]
    assert s.dtypes == {} and s.total_bytes == 0 and s.tensors == []
