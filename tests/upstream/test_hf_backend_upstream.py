"""The ``vllm`` column of ``inspect --model hf`` against vLLM 0.34.0's Transformers backend itself.

For every (architecture, mutation) of ``hf_cases`` (checkpoints transformers wrote), upstream's
wrapper is built from the wheel's source (``upstream.hf_backend``) and really loads the
checkpoint on the CPU: its ``AutoWeightsLoader`` raises at the first name it cannot place (the
keys under that name are set aside and the load is run again, until it passes), and
``DefaultModelLoader.track_weights_loading`` names what no key filled. loadkit's header-only
answer must be the same: the wrapper chosen, its ignore lists, every rule of the derived mapper
(transformers' renamings, the regex rules, the drops LegacyMixin adds) and where it sends every
key, which names are aliases of a tied word embedding, and the missing, unexpected and mismatched
names.
"""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_cases import (
    ARCHS,
    MUTATIONS,
    Verdict,
    cases,
    loadkit_verdict,
    read_tensors,
    write_variant,
)

from loadkit import open_checkpoint
from loadkit.loading.tensors import tied_embedding_aliases
from loadkit.models.transformers import from_config
from loadkit.models.transformers.config import load_config
from upstream.hf_backend import Backend, load_backend

NO_SUCH_NAME = re.compile(r"There is no module or parameter named '([^']*)'")
NESTED = re.compile(r"Attempted to load nested weight '([^']*)'")
NOT_INITIALIZED = "Following weights were not initialized from checkpoint: "


# Where loadkit's vllm column is not upstream's answer yet: each pinned exactly (docs/fidelity.md,
# "Where the vllm column is not vLLM's answer").
# - A head bias saved inside the base model (``model.lm_head.bias``): CausalMixin loads it and
#   returns the checkpoint's name, so track_weights_loading, which compares parameter names,
#   calls ``lm_head.bias`` not initialized and vLLM raises; loadkit sees the write and calls it
#   loaded.
HEAD_BIAS_INSIDE_BASE = {("phi", "head inside base"), ("gptj", "head inside base")}
HEAD_BIAS_PREFIXED = {("phi", "model. before every key"), ("gptj", "model. before every key")}
# - LegacyMixin reads ``text_config.pad_token_id``; a config without one (ViTConfig) makes
#   upstream's embedding wrapper fail to build (AttributeError); loadkit builds it.
NO_PAD_TOKEN = {"vit"}


@pytest.fixture(scope="session")
def backend(up) -> Backend:
    return load_backend(up, up.src)


def _stream(weights: dict[str, Any], left_out: set[str], last: list[str]):
    """The checkpoint less ``left_out``; ``last`` records each key as it is handed over."""
    for k, v in weights.items():
        if k not in left_out:
            last.append(k)
            yield k, v


def upstream_verdict(backend: Backend, config: Any, folder: Path) -> tuple[Verdict, Any]:
    """Load ``folder`` with upstream's wrapper until it passes; what it refused and left."""
    weights = {k: v for k, v in open_checkpoint(folder).weights()}
    left_out: set[str] = set()
    unexpected: set[str] = set()
    mismatched: set[str] = set()
    for _ in range(len(weights) + 1):
        model = backend.build(config)
        mapper = model.hf_to_vllm_mapper
        last: list[str] = []
        try:
            loaded = model.load_weights(_stream(weights, left_out, last))
        except ValueError as exc:
            found = NO_SUCH_NAME.search(str(exc)) or NESTED.search(str(exc))
            assert found, exc
            name = found.group(1)
            culprits = {
                k
                for k in weights
                if k not in left_out
                and (m := mapper._map_name(k)) is not None
                and (m == name or m.startswith(name + "."))
            }
            assert culprits, (name, exc)
            unexpected |= culprits
            left_out |= culprits
            continue
        except AssertionError:  # default_weight_loader's shape check, at the key being loaded
            key = last[-1]
            mismatched.add(mapper._map_name(key))
            left_out.add(key)
            continue
        try:
            backend.track_weights_loading(None, model, set(loaded))
            missing: set[str] = set()
        except ValueError as exc:
            text = str(exc)
            assert text.startswith(NOT_INITIALIZED), text
            missing = ast.literal_eval(text[len(NOT_INITIALIZED) :])
        verdict = Verdict(
            frozenset(missing - mismatched), frozenset(unexpected), frozenset(mismatched)
        )
        return verdict, model
    raise AssertionError("upstream never finished loading")


def _regex_rules(mapper: Any) -> tuple[list[tuple[str, str]], set[str]]:
    """(rules with a target, in order), {patterns that drop}."""
    kept, dropped = [], set()
    for pattern, target in mapper.orig_to_new_regex.items():
        text = pattern.pattern if hasattr(pattern, "pattern") else pattern
        if target is None:
            dropped.add(text)
        else:
            kept.append((text, target))
    return kept, dropped


@pytest.mark.parametrize(("arch", "mutation"), cases())
def test_vllm_column_equals_upstream(arch, mutation, backend, hf_clean, tmp_path):
    clean = hf_clean(arch)
    if mutation == "clean":
        folder = clean
    else:
        tensors = MUTATIONS[mutation](ARCHS[arch], read_tensors(clean))
        assert tensors is not None
        shards = 3 if "sharded" in mutation else 1
        folder = write_variant(clean, tensors, tmp_path / "variant", shards=shards)
    config, _ = load_config(folder)
    if arch in NO_PAD_TOKEN:
        with pytest.raises(AttributeError, match="pad_token_id"):
            backend.build(config)
        assert not hasattr(config, "pad_token_id")
        return

    theirs, model = upstream_verdict(backend, config, folder)
    ours_model = from_config(folder, device="meta")
    assert type(ours_model).__name__ == backend.wrapper_name(config) == type(model).__name__

    # The same mapper: transformers' renamings, then the regex rules (the ignore patterns are a
    # set upstream: compared as one), and the same skip lists.
    up_mapper, our_mapper = model.hf_to_vllm_mapper, ours_model.hf_to_vllm_mapper
    assert [repr(r) for r in up_mapper.orig_to_new_renaming] == [
        repr(r) for r in our_mapper.orig_to_new_renaming
    ]
    assert _regex_rules(up_mapper) == _regex_rules(our_mapper)
    for key in open_checkpoint(folder).tensors:
        assert our_mapper.map_name(key) == up_mapper._map_name(key), key
    for stage in ("prefix", "substr", "suffix", "stacked"):
        table = f"orig_to_new_{stage}"
        assert getattr(our_mapper, table) == getattr(up_mapper, table), table
    # Before any load: upstream's AutoWeightsLoader extends these lists in place (a documented
    # deviation, "caller-lists").
    fresh = backend.build(config)
    for attr in ("ignore_unexpected_prefixes", "ignore_unexpected_suffixes"):
        assert getattr(ours_model, attr) == getattr(fresh, attr), attr
    assert {n for n, _ in ours_model.named_parameters()} == {n for n, _ in fresh.named_parameters()}
    aliases = backend.aliases(fresh)
    assert tied_embedding_aliases(ours_model) == aliases

    ours, report = loadkit_verdict(folder)
    if (arch, mutation) in HEAD_BIAS_INSIDE_BASE | HEAD_BIAS_PREFIXED:
        assert theirs.missing - ours.missing == {"lm_head.bias"}
        theirs = replace(theirs, missing=theirs.missing - {"lm_head.bias"})
    assert ours == theirs, (
        f"\nupstream: {theirs.describe()}\nloadkit:  {ours.describe()}\n{report.render(limit=50)}"
    )


def test_the_divergences_are_vllms_own(backend, hf_clean):
    """Untouched checkpoints vLLM 0.34.0's backend refuses, refused by upstream's code (T5 for
    its untied embeddings; GPT-NeoX, refused by 0.28.0, loads)."""
    for arch in ("bart", "mbart", "deberta-v2", "electra", "distilbert-cls", "llama-cls", "t5"):
        folder = hf_clean(arch)
        config, _ = load_config(folder)
        theirs, _ = upstream_verdict(backend, config, folder)
        assert not theirs.clean, arch
        assert theirs == loadkit_verdict(folder)[0], arch
    folder = hf_clean("gpt-neox")
    assert upstream_verdict(backend, load_config(folder)[0], folder)[0].clean


def test_harness_loads_real_values(backend, hf_clean):
    # Not names alone: upstream's load really copies the checkpoint's values into its wrapper.
    folder = hf_clean("llama")
    config, _ = load_config(folder)
    model = backend.build(config)
    model.load_weights(open_checkpoint(folder).weights())
    saved = dict(open_checkpoint(folder).weights())["model.norm.weight"]
    assert torch.equal(model.model.norm.weight.detach(), saved)
