"""The vocabulary-parallel embedding and head, one rank at a time (no processes).

Expected rows are written out from vLLM 0.28.0's ``vocab_parallel_embedding.py`` (read, not
imported): the vocabulary pads to 64 and rank ``r`` holds padded rows ``r*p .. (r+1)*p``.
"""

import pytest

from loadkit.parallel import ParallelLMHead, VocabParallelEmbedding, pad_vocab_size, vocab_shard

from .test_linear import build, held, load, rows_of


def test_vocab_pads_to_64_and_zeroes_rows_past_the_vocabulary():
    assert pad_vocab_size(100) == 128 and pad_vocab_size(128) == 128 and pad_vocab_size(1) == 64
    shard = vocab_shard(100, 3, 4)
    assert (shard.padded_start, shard.padded_end, shard.start, shard.end) == (96, 128, 96, 100)
    assert (shard.real_rows, shard.padding_rows) == (4, 28)
    layer = build(VocabParallelEmbedding, 3, 4, 100, 2)
    layer.weight.data.fill_(-1.0)
    load(layer, layer.weight, rows_of(100, 2))
    assert held(layer.weight) == [96, 97, 98, 99] + [0] * 28
    head = build(ParallelLMHead, 1, 4, 100, 2)
    load(head, head.weight, rows_of(100, 2))
    assert held(head.weight) == list(range(32, 64))


def test_vocab_rejects_a_table_of_another_size():
    layer = build(VocabParallelEmbedding, 0, 2, 100, 2)
    with pytest.raises(ValueError, match=r"parameter has shape \[100, 2\].*\[96, 2\]"):
        load(layer, layer.weight, rows_of(96, 2))
