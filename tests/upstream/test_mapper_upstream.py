"""WeightsMapper against vLLM 0.34.0's: generated rules of all six stages (a stacked rule's shard
ids may be a list), generated ``weights_transforms``, generated names; ``get_rename_mapper``."""

from __future__ import annotations

import re

import pytest
import regex
import torch
from hypothesis import given
from hypothesis import strategies as st
from repo_paths import DATA
from stacked_cases import names as stacked_names
from stacked_cases import overlapping_rules
from transformers.core_model_loading import WeightRenaming

from upstream.common import (
    PROPERTY,
    Difference,
    loadkit_side,
    raised_differences,
    rare,
    record,
    run,
)
from upstream.fetch import OLD, REFERENCE

PARTS = ["model", "layers", "0", "1", "q_proj", "k_proj", "weight", "bias", "norm", "gamma"]
FRAGMENTS = ["", "model.", "layers.", ".0", "0", "q_proj", "k_proj", "proj", ".weight", "weight",
             "norm", "gamma", "bias", ".", "h.", "x"]  # fmt: skip
SHARDS = [0, 1, "q", "k"]
SHARD_LISTS = [["q", "k"], [0, 1], ["k"], ["v", "v"]]
# Each pattern with replacements valid for it (``\\2``, invalid for all, is drawn rarely).
PATTERNS = {
    r"layers\.(\d+)": ["h.", r"h.\1", r"\g<1>", r"layers.\1."],
    r"^model\.": ["", "m.", "model.model."],
    r"(\w+)_proj": [r"\1_p", r"\g<1>"],
    r"\.weight$": [".w", ""],
    r"norm": ["ln", "norm"],
    r"(?P<n>\d)": [r"\g<n>0", "d"],
    r"gamma|beta": ["weight"],
    r"(a)?x": [r"\1y", "y"],  # an optional group that may not take part: "" in the template
}

names = st.lists(st.sampled_from(PARTS), min_size=1, max_size=4).map(".".join)
fragment = st.sampled_from(FRAGMENTS)
value = st.one_of(st.none(), fragment)


class Rename:
    """A renaming object as transformers' ``WeightRenaming`` is one: a regex and its target."""

    def __init__(self, source: str, target: str) -> None:
        self.source_patterns, self.target_patterns = [source], [target]
        self._rx = re.compile(source)

    def rename_source_key(self, key: str):
        new, n = self._rx.subn(self.target_patterns[0], key, count=1)
        return new, (self.source_patterns[0] if n else None)

    def __repr__(self) -> str:
        return f"Rename({self.source_patterns[0]!r}, {self.target_patterns[0]!r})"


RENAMES = [("gamma", "weight"), (r"^model\.", ""), (r"layers\.(\d)", r"h.\1"), ("k_proj", "v_proj"),
           (r"^model\.", "m."), ("norm", "ln")]  # fmt: skip

# transformers' own WeightRenaming (what vLLM's Transformers backend puts there), and a minimal
# object with only the method the mapper calls.
renamings = st.lists(
    st.tuples(st.sampled_from(RENAMES), st.booleans()).map(
        lambda r: WeightRenaming(*r[0]) if r[1] else Rename(*r[0])
    ),
    max_size=2,
)


@st.composite
def regex_rules(draw):
    rules = {}
    for _ in range(draw(st.integers(0, 2))):
        source = draw(st.sampled_from(sorted(PATTERNS)))
        compile_ = str if draw(rare()) else draw(st.sampled_from([re.compile, regex.compile]))
        if draw(rare(8)):
            template = None
        elif draw(rare()):
            template = r"\2"
        else:
            template = draw(st.sampled_from(PATTERNS[source]))
        rules[compile_(source)] = template
    return rules


@st.composite
def rule_table(draw, *, stacked: bool = False, suffix: bool = False):
    table = {}
    for _ in range(draw(st.integers(0, 2))):
        key = draw(fragment)
        if suffix and key == "" and not draw(rare(3)):
            key = ".weight"
        if stacked:
            shards = (
                st.sampled_from(SHARD_LISTS) if draw(st.booleans()) else st.sampled_from(SHARDS)
            )
            table[key] = None if draw(rare()) else (draw(fragment), draw(shards))
        else:
            table[key] = draw(value)
    return table


# Transforms over the raw stream (the same functions for both sides): each passes what it does not
# recognise through unchanged, as upstream's contract says.
def split_fused(weights):
    """``...qkv.weight`` -> ``...q_proj.weight`` and ``...k_proj.weight`` (halves of it)."""
    for name, w in weights:
        if name.endswith("q_proj.k_proj"):
            yield name.replace("q_proj.k_proj", "q_proj"), w[:1]
            yield name.replace("q_proj.k_proj", "k_proj"), w[1:]
        else:
            yield name, w


def drop_gamma(weights):
    return ((n, w) for n, w in weights if not n.endswith("gamma"))


def doubled(weights):
    return ((n, w * 2) for n, w in weights)


TRANSFORMS = [split_fused, drop_gamma, doubled]


@st.composite
def mapper_rules(draw):
    # Every stage left at its default when it has no rules, renaming and transforms included.
    renaming = draw(renamings)
    transforms = draw(st.lists(st.sampled_from(TRANSFORMS), max_size=2)) if draw(rare(4)) else []
    return {
        **({"orig_to_new_renaming": renaming} if renaming else {}),
        **({"weights_transforms": transforms} if transforms else {}),
        "orig_to_new_regex": draw(regex_rules()),
        "orig_to_new_substr": draw(rule_table()),
        "orig_to_new_stacked": draw(rule_table(stacked=True)),
        "orig_to_new_prefix": draw(rule_table()),
        "orig_to_new_suffix": draw(rule_table(suffix=True)),
    }


NO_RULES = {f"orig_to_new_{s}": {} for s in ("regex", "substr", "stacked", "prefix", "suffix")}

# --- which differences are the documented ones ---------------------------------------------------


def _bad_template(pattern, template) -> bool:
    groups = pattern.groups if not isinstance(pattern, str) else re.compile(pattern).groups
    named = dict(getattr(pattern, "groupindex", {}) or {})
    probe = re.compile("".join(
        f"(?P<{n}>)" if n else "()"
        for n in (next((k for k, v in named.items() if v == i), None) for i in range(1, groups + 1))
    ))  # fmt: skip
    try:
        probe.sub(template, "")
    except (re.error, IndexError):
        return True
    return False


def build_deviation(rules) -> str | None:
    """Why loadkit may refuse these rules at build time (upstream builds anything)."""
    if "" in rules["orig_to_new_suffix"]:
        return "mapper-build"
    for pattern, template in rules["orig_to_new_regex"].items():
        if template is not None and _bad_template(pattern, template):
            return "mapper-build"
    return None


def use_deviation(rules, err: BaseException) -> str | None:
    """Which documented deviation an upstream error at use comes from, if any."""
    text = f"{type(err).__name__}: {err}"
    if any(isinstance(k, str) for k in rules["orig_to_new_regex"]) and (
        "'str' object has no attribute 'search'" in text
    ):
        return "str-regex"
    if (
        None in rules["orig_to_new_stacked"].values()
        and "cannot unpack non-iterable NoneType" in text
    ):
        return "stacked-none"
    if "" in rules["orig_to_new_suffix"] and "empty separator" in text:
        return "mapper-build"
    if isinstance(err, (re.error, regex.error, IndexError)) and build_deviation(rules):
        return "mapper-build"
    return None


def compare_mappers(up_m, lk_m, rules, names_) -> list[Difference]:
    diffs: list[Difference] = []
    for name in names_:
        u = run(lambda: up_m._map_name_with_shard(name))  # noqa: B023 (called at once)
        k = run(lambda: lk_m.map_name_with_shard(name))  # noqa: B023
        if u.raised or k.raised:
            dev = use_deviation(rules, u.error) if u.raised and not k.raised else None
            if not (u.raised and k.raised and type(u.error) is type(k.error)):
                diffs.append(
                    Difference(f"{name!r}: upstream {u.describe()}, loadkit {k.describe()}", dev)
                )
            continue
        if u.value != k.value or (u.value is not None and type(u.value[1]) is not type(k.value[1])):
            diffs.append(Difference(f"{name!r}: upstream {u.value!r}, loadkit {k.value!r}"))
        if up_m.map_name(name) != lk_m.map_name(name):
            diffs.append(Difference(f"{name!r}: map_name differs"))
        if up_m._map_name(name) != lk_m._map_name(name):
            diffs.append(Difference(f"{name!r}: _map_name differs"))
    if diffs:
        return diffs  # the bulk methods repeat the per-name difference

    u_list, k_list = up_m.apply_list(list(names_)), lk_m.apply_list(list(names_))
    if u_list != k_list:
        diffs.append(Difference(f"apply_list: upstream {u_list}, loadkit {k_list}"))
    table = {n: i for i, n in enumerate(names_)}
    if up_m.apply_dict(table) != lk_m.apply_dict(table):
        diffs.append(Difference("apply_dict differs"))

    def applied(m):
        stream = ((n, torch.arange(2.0) + i) for i, n in enumerate(names_))
        out = list(m.apply(stream))  # read after the whole stream: each yield its own shard id
        storages = [t.untyped_storage().data_ptr() for _, t in out]
        return [
            (n, t.tolist(), getattr(t, "shard_id", "<none>"), storages.index(p))
            for (n, t), p in zip(out, storages, strict=True)
        ]

    u_applied, k_applied = run(lambda: applied(up_m)), run(lambda: applied(lk_m))
    if u_applied.raised or k_applied.raised:
        diffs += raised_differences(u_applied, k_applied, what="apply: ")
    elif u_applied.value != k_applied.value:
        diffs.append(Difference(f"apply: upstream {u_applied.value}, loadkit {k_applied.value}"))
    return diffs


def _check(up, rules, names_, prop, behaviour="old"):
    lk = loadkit_side()
    up_m = up.WeightsMapper(**rules)
    built = run(lambda: lk.WeightsMapper(**rules, behaviour=behaviour))
    if built.raised:
        dev = build_deviation(rules)
        from loadkit.errors import MapperConfigError

        ok = isinstance(built.error, MapperConfigError) and dev is not None
        record(prop, [Difference(f"loadkit refused at build: {built.error}", dev if ok else None)])
        return
    record(prop, compare_mappers(up_m, built.value, rules, names_))


@PROPERTY
@given(rules=mapper_rules(), names_=st.lists(names, min_size=1, max_size=6))
def test_mapper_maps_like_upstream(up, rules, names_):
    _check(up, rules, names_, "mapper: map_name/apply/apply_list/apply_dict")


@PROPERTY
@given(rules=mapper_rules(), names_=st.lists(names, min_size=1, max_size=6))
def test_rename_mapper_maps_like_upstream(up, rules, names_):
    """``get_rename_mapper()``: no stacked rules, no drops, no transforms, on both sides."""
    lk = loadkit_side()
    built = run(lambda: lk.WeightsMapper(**rules).get_rename_mapper())
    prop = "mapper: get_rename_mapper"
    if built.raised:
        from loadkit.errors import MapperConfigError

        dev = build_deviation(rules)
        ok = isinstance(built.error, MapperConfigError) and dev is not None
        record(prop, [Difference(f"loadkit refused at build: {built.error}", dev if ok else None)])
        return
    up_m = up.WeightsMapper(**rules).get_rename_mapper()
    kept = {
        f: ({k: v for k, v in t.items() if v is not None} if isinstance(t, dict) else t)
        for f, t in rules.items()
    }
    record(prop, compare_mappers(up_m, built.value, {**kept, "orig_to_new_stacked": {}}, names_))


def _merged(a, b):
    return {f: [*a.get(f, []), *b.get(f, [])] if f in LISTS else {**a[f], **b[f]} for f in {*a, *b}}


LISTS = ("orig_to_new_renaming", "weights_transforms")


@PROPERTY
@given(a=mapper_rules(), b=mapper_rules(), names_=st.lists(names, min_size=1, max_size=6))
def test_merged_mapper_maps_like_upstream(up, a, b, names_):
    lk = loadkit_side()
    merged_rules = _merged(a, b)
    built = run(lambda: lk.WeightsMapper(**a) | lk.WeightsMapper(**b))
    up_m = up.WeightsMapper(**a) | up.WeightsMapper(**b)
    prop = "mapper: merged mappers"
    if built.raised:
        from loadkit.errors import MapperConfigError

        dev = build_deviation(a) or build_deviation(b)
        ok = isinstance(built.error, MapperConfigError) and dev is not None
        record(prop, [Difference(f"loadkit refused at build: {built.error}", dev if ok else None)])
        return
    record(prop, compare_mappers(up_m, built.value, merged_rules, names_))


# --- the stacked stage (bug 5): loadkit's "old" is vLLM 0.34.0's (and 0.28.0's) ---------------


@PROPERTY
@given(rules=overlapping_rules(), names_=st.lists(stacked_names, min_size=1, max_size=6))
def test_stacked_stage_old_maps_like_upstream(up, rules, names_):
    lk_m = loadkit_side().WeightsMapper(orig_to_new_stacked=rules, behaviour="old")
    up_m = up.WeightsMapper(orig_to_new_stacked=rules)
    record(
        "mapper: stacked stage, old",
        compare_mappers(up_m, lk_m, {**NO_RULES, "orig_to_new_stacked": rules}, names_),
    )


@PROPERTY
@given(rules=mapper_rules(), names_=st.lists(names, min_size=1, max_size=6))
def test_other_stages_under_new_map_like_upstream(up, rules, names_):
    """Only the stacked stage depends on behaviour: without stacked rules, "new" is upstream."""
    rules = {**rules, "orig_to_new_stacked": {}}
    _check(up, rules, names_, "mapper: other stages, new", behaviour="new")


@pytest.mark.parametrize("version", [OLD, REFERENCE])
def test_vllm_still_rematches_its_own_output(up_at, version):
    """The wheel's own stage: q_proj -> qkv_proj, then v_proj inside it (vLLM #48423, #48449),
    in 0.28.0 and still in 0.34.0."""
    rules = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v")}
    m = up_at(version).WeightsMapper(orig_to_new_stacked=rules)
    key = "vision.layers.0.self_attn.{}.weight"
    assert m._map_name_with_shard(key.format("q_proj")) == (key.format("qkqkv_proj"), "v")
    assert m._map_name_with_shard(key.format("k_proj")) == (key.format("qkqkv_proj"), "v")
    assert m._map_name_with_shard(key.format("qkv_proj")) == (key.format("qkqkv_proj"), "v")
    new = loadkit_side().WeightsMapper(orig_to_new_stacked=rules, behaviour="new")
    assert new.map_name_with_shard(key.format("q_proj")) == (key.format("qkv_proj"), "q")


@pytest.mark.parametrize("version", [OLD, REFERENCE])
def test_vision_tower_checkpoint_fails_in_vllm_and_loads_with_new(up_at, version):
    """The committed vision tower through upstream's own AutoWeightsLoader and WeightsMapper
    (0.28.0's and 0.34.0's):
    the load fails on qkqkv_proj as loadkit's old stage does; with loadkit's new mapper's names
    and shard ids, upstream's loader fills every parameter with the checkpoint's values."""
    from loadkit import open_checkpoint
    from loadkit.models import vision_tower as vt

    up = up_at(version)
    ck = open_checkpoint(DATA / "vision_tower" / "model.safetensors")
    config = vt.config_from_checkpoint(ck.tensors)
    model = vt.VisionTower(config)
    mapper = up.WeightsMapper(orig_to_new_stacked=vt.QKV_RULES)
    try:
        up.AutoWeightsLoader(model).load_weights(ck.weights(), mapper=mapper)
    except ValueError as exc:
        assert str(exc).startswith(
            "There is no module or parameter named "
            "'vision_model.encoder.layers.0.self_attn.qkqkv_proj' in VisionTower"
        ), exc
    else:
        raise AssertionError(f"vLLM {version} loaded the vision tower")
    model = vt.VisionTower(config)
    new = loadkit_side().WeightsMapper(orig_to_new_stacked=vt.QKV_RULES, behaviour="new")
    loaded = up.AutoWeightsLoader(model).load_weights(new.apply(ck.weights()))
    assert loaded == {n for n, _ in model.named_parameters()}
    truth = dict(ck.weights())
    rows = vt.qkv_rows(model, truth)
    assert all(held == [f"{s} {j}" for s in "qkv" for j in range(16)] for held in rows.values())
