"""`inspect --model hf` against transformers itself, on checkpoints transformers wrote.

For each architecture (tiny config, seeded init, ``save_pretrained``; sharded for some) and each
mutation of its checkpoint (a key dropped, renamed, reshaped, an extra key, the base-model prefix
added or removed, a head saved inside the base model, legacy names, a stale buffer, a tied head
saved), loadkit's missing / unexpected / mismatched lists must equal transformers'
``from_pretrained(..., output_loading_info=True)`` ones, except where vLLM's backend differs
(``hf_cases.KNOWN_DIFFERENCES``): there loadkit must give vLLM's answer, derived from transformers'
one and the stated reason, and the two must really differ.
"""

from __future__ import annotations

import pytest
from hf_cases import ARCHS, KNOWN_DIFFERENCES, cases, run_case


@pytest.mark.slow  # 93 cases, each a save, a from_pretrained and an inspect: about 20 s of CPU
@pytest.mark.parametrize(("arch", "mutation"), cases())
def test_inspect_agrees_with_transformers(arch, mutation, hf_clean, tmp_path):
    row = run_case(ARCHS[arch], mutation, hf_clean(arch), tmp_path / "variant")
    ours, hf, expected, report = row["loadkit"], row["transformers"], row["expected"], row["report"]
    assert ours == expected, (
        f"\ntransformers: {hf.describe()}\nexpected:     {expected.describe()}"
        f"\nloadkit:      {ours.describe()}\n{report.render(limit=50)}"
    )
    assert report.exit_status == (0 if expected.clean else 1)
    if arch not in KNOWN_DIFFERENCES:
        assert ours == hf
    if mutation == "clean":
        # A clean checkpoint: transformers loads it; vLLM too, unless a known difference bites,
        # and then the difference must be real (this fails once transformers or the rule moves).
        assert hf.clean
        assert ours.clean == (arch not in KNOWN_DIFFERENCES)


def test_at_least_ten_architectures_and_every_mutation_kind():
    assert len(ARCHS) >= 10
    names = {m for _, m in cases()}
    assert {
        "clean",
        "key dropped",
        "key renamed",
        "key reshaped",
        "extra key",
        "base prefix added/removed",
        "head inside base",
    } <= names
    # Each wrapper is exercised: generative, embedding and classification models.
    kinds = {ARCHS[a].cls for a, _ in cases()}
    assert {"BertModel", "BertForSequenceClassification", "LlamaForCausalLM"} <= kinds
