"""WeightsMapper against upstream's: generated rules of all six stages, generated names."""

from __future__ import annotations

import re

import regex
import torch
from hypothesis import given
from hypothesis import strategies as st
from repo_paths import DATA
from stacked_cases import names as stacked_names
from stacked_cases import overlapping_rules
from transformers.core_model_loading import WeightRenaming

from upstream.common import PROPERTY, Difference, loadkit_side, rare, record, run

PARTS = ["model", "layers", "0", "1", "q_proj", "k_proj", "weight", "bias", "norm", "gamma"]
FRAGMENTS = ["", "model.", "layers.", ".0", "0", "q_proj", "k_proj", "proj", ".weight", "weight",
             "norm", "gamma", "bias", ".", "h.", "x"]  # fmt: skip
SHARDS = [0, 1, "q", "k"]
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
            table[key] = None if draw(rare()) else (draw(fragment), draw(st.sampled_from(SHARDS)))
        else:
            table[key] = draw(value)
    return table


@st.composite
def mapper_rules(draw):
    # Every stage left at its default when it has no rules, renaming included.
    renaming = draw(renamings)
    return {
        **({"orig_to_new_renaming": renaming} if renaming else {}),
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
        out = []
        for n, t in m.apply((n, torch.zeros(1)) for n in names_):
            out.append((n, getattr(t, "shard_id", "<none>")))
        return out

    if applied(up_m) != applied(lk_m):
        diffs.append(Difference(f"apply: upstream {applied(up_m)}, loadkit {applied(lk_m)}"))
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
@given(a=mapper_rules(), b=mapper_rules(), names_=st.lists(names, min_size=1, max_size=6))
def test_merged_mapper_maps_like_upstream(up, a, b, names_):
    lk = loadkit_side()
    merged_rules = {
        f: [*a.get(f, []), *b.get(f, [])] if f.endswith("renaming") else {**a[f], **b[f]}
        for f in {*a, *b}
    }
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


# --- the stacked stage (bug 5): loadkit's "old" is vLLM 0.28.0's --------------------------------


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


def test_vllm_0_28_0_still_rematches_its_own_output(up):
    """The wheel's own stage: q_proj -> qkv_proj, then v_proj inside it (vLLM #48423, #48449)."""
    rules = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v")}
    m = up.WeightsMapper(orig_to_new_stacked=rules)
    key = "vision.layers.0.self_attn.{}.weight"
    assert m._map_name_with_shard(key.format("q_proj")) == (key.format("qkqkv_proj"), "v")
    assert m._map_name_with_shard(key.format("k_proj")) == (key.format("qkqkv_proj"), "v")
    assert m._map_name_with_shard(key.format("qkv_proj")) == (key.format("qkqkv_proj"), "v")
    new = loadkit_side().WeightsMapper(orig_to_new_stacked=rules, behaviour="new")
    assert new.map_name_with_shard(key.format("q_proj")) == (key.format("qkv_proj"), "q")


def test_vision_tower_checkpoint_fails_in_vllm_0_28_0_and_loads_with_new(up):
    """The committed vision tower through upstream's own AutoWeightsLoader and WeightsMapper:
    the load fails on qkqkv_proj as loadkit's old stage does; with loadkit's new mapper's names
    and shard ids, upstream's loader fills every parameter with the checkpoint's values."""
    from loadkit import open_checkpoint
    from loadkit.models import vision_tower as vt

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
        raise AssertionError("vLLM 0.28.0 loaded the vision tower")
    model = vt.VisionTower(config)
    new = loadkit_side().WeightsMapper(orig_to_new_stacked=vt.QKV_RULES, behaviour="new")
    loaded = up.AutoWeightsLoader(model).load_weights(new.apply(ck.weights()))
    assert loaded == {n for n, _ in model.named_parameters()}
    truth = dict(ck.weights())
    rows = vt.qkv_rows(model, truth)
    assert all(held == [f"{s} {j}" for s in "qkv" for j in range(16)] for held in rows.values())
