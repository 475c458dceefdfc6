"""``--model hf`` on vLLM 0.34.0's native classes against the wheel's own ``load_weights``.

For every architecture loadkit re-implements (``loadkit.models.native``) and every way a
checkpoint goes wrong (``tests/native_cases.py``: a renamed prefix, a dropped tensor, a dropped
expert, fused experts where per-expert ones are expected and the reverse, a transposed matrix, an
extra head, a tied head flipped, layers shifted, ...), one real safetensors file is judged twice:

- loadkit: ``loadkit inspect --model hf`` (header only): the dry load on the meta device, and
  the verdict it gives;
- vLLM 0.34.0: the wheel's own loading code (``tests/upstream/native_models.py``) run on a loadkit
  model of the same config on the CPU, over the file's real tensors: the models' and layers'
  ``load_weights``, ``AutoWeightsLoader``, then ``track_weights_loading``. vLLM stops at the
  first key that fails; the harness loads again without it until a load goes through, so that
  every failing key is found, as the dry load finds them.

Both must give the same keys the model has no place for, the same keys whose load fails, the
same keys loaded and set aside (skipped, ignored, taken and loaded nowhere), the same parameters
vLLM's check refuses and the same it leaves uninitialised without an error. One allowance: once a
key fails, vLLM never gets further, so what its check would then say about the parameter that key
was loading into is no prediction; those parameters are compared no further.

``make test`` runs the ``fast_upstream`` cases (every architecture, the cases that most often
differ); ``make test-upstream`` runs them all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from native_cases import ARCHS, cases, clean_checkpoints, make_variant

from loadkit.terms import Status
from upstream.fetch import REFERENCE, UpstreamFetchError, ensure_sources
from upstream.native_models import (
    NativeUpstream,
    Outcome,
    load_native,
    read_checkpoint,
    run_upstream,
)

FAST = ("clean", "stacked shard dropped", "expert dropped", "experts fused", "tied head flipped")
SET_ASIDE = (
    Status.SKIPPED,
    Status.IGNORED,
    Status.MAPPER_DROPPED,
    Status.DELEGATED,
    Status.UNCONSUMED,
)


@pytest.fixture(scope="module")
def native() -> NativeUpstream:
    try:
        return load_native(ensure_sources(REFERENCE))
    except UpstreamFetchError as exc:
        pytest.fail(f"cannot fetch the vLLM {REFERENCE} wheel: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def clean(tmp_path_factory, quiet_transformers):
    return clean_checkpoints(tmp_path_factory.mktemp("native-upstream"))


@dataclass
class Judged:
    """loadkit's dry load of one checkpoint, in the oracle's terms, and its verdict."""

    unexpected: set[str]
    failed: set[str]
    loaded: set[str]
    set_aside: set[str]
    refused: set[str]
    quiet: set[str]
    failed_into: set[str]  # the parameters failing keys were loading into
    delegated: set[str]
    verdict: object
    failure: str | None


def loadkit_side(folder) -> Judged:
    from loadkit_inspect.inspector import build, load, map_names, read_checkpoint
    from loadkit_inspect.loaders import vllm_side, vllm_verdict
    from loadkit_inspect.options import LoadRules
    from loadkit_inspect.progress import Progress

    read = read_checkpoint(folder)
    names = map_names(None, "given mapper", False, read)
    built = build("hf", {}, read, names)
    with Progress(False) as bar:
        loaded = load(LoadRules(), read, built, names, bar)
    report, tracked = loaded.report, loaded.tracked
    assert tracked is not None  # a native class: vLLM's track_weights_loading judges it
    by: dict[str, set[str]] = {}
    for k in report.keys:
        by.setdefault(k.status, set()).add(k.name)
    failing = [k for k in report.keys if k.status in (Status.SHAPE_MISMATCH, Status.LOAD_ERROR)]
    verdict = vllm_verdict(report, read.summary, side=vllm_side(built.module, loaded))
    return Judged(
        unexpected=by.get(Status.UNEXPECTED, set()),
        failed={k.name for k in failing},
        loaded=by.get(Status.LOADED, set()),
        set_aside=set().union(*(by.get(s, set()) for s in SET_ASIDE)),
        refused=set(tracked.refused),
        # an expert slice (``w13_weight[expert 1, w1]``): its parameter, as vLLM's memory holds it
        quiet={re.sub(r"\[.*\]$", "", q) for q in tracked.quiet},
        failed_into={t for k in failing for t in (k.target or "").split(", ") if t},
        delegated=by.get(Status.DELEGATED, set()),
        verdict=verdict,
        failure=report.failure,
    )


def _beyond(names: set[str], failed_into: set[str]) -> set[str]:
    """``names`` less the parameters failing keys were loading into (and their shards)."""
    return {n for n in names if not any(n == p or n.startswith(p + ".") for p in failed_into)}


def _param(case: tuple[str, str]):
    arch, mutation = case
    marks = [pytest.mark.fast_upstream] if mutation in FAST else []
    return pytest.param(arch, mutation, id=f"{arch}-{mutation.replace(' ', '_')}", marks=marks)


@pytest.mark.parametrize(("arch", "mutation"), [_param(c) for c in cases()])
def test_loadkit_judges_as_the_wheels_load_weights(arch, mutation, native, clean, tmp_path):
    folder = make_variant(ARCHS[arch], mutation, clean(arch), tmp_path / "variant")
    if folder is None:
        pytest.skip(f"{mutation} does not apply to {arch}")
    ours = loadkit_side(folder)
    theirs = upstream_side(native, folder)
    assert theirs.after_last is None and ours.failure is None, (theirs.after_last, ours.failure)
    assert ours.unexpected == theirs.unexpected
    assert ours.failed == set(theirs.failed), theirs.failed
    assert ours.loaded == theirs.loaded
    assert ours.set_aside == theirs.set_aside
    assert _beyond(ours.refused, ours.failed_into) == _beyond(theirs.refused, ours.failed_into)
    assert _beyond(ours.quiet, ours.failed_into) == _beyond(theirs.quiet, ours.failed_into)
    # and the verdict says what vLLM does: it raises, or loads without an error, leaving
    # tensors uninitialised or keys loaded nowhere (quiet), or not
    fails = bool(theirs.unexpected or theirs.failed or theirs.refused)
    verdict = ours.verdict
    if fails:
        assert not verdict.clean and not verdict.quiet, verdict.phrase()
    else:
        assert verdict.clean == (not theirs.quiet and not ours.delegated), verdict.phrase()
        assert verdict.quiet == (not verdict.clean), verdict.phrase()


def upstream_side(native: NativeUpstream, folder) -> Outcome:
    from transformers import AutoConfig

    from loadkit.models.native import native_class
    from loadkit_inspect.models.vllm import resolve

    config = AutoConfig.from_pretrained(folder)
    cls = native_class(resolve(config).name)
    keys, tensors = read_checkpoint(folder / "model.safetensors")
    return run_upstream(native, lambda: cls(config), keys, tensors)


def test_every_native_class_is_held_against_the_wheel():
    from loadkit.models.native import CLASSES

    assert set(CLASSES) == {ARCHS[a].vllm_class or ARCHS[a].cls for a, _ in cases()}
