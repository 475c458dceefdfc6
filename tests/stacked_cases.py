"""Generated cases for the stacked mapper stage: realistic names, rules that overlap.

Names are built from the components real checkpoints have (a tower or decoder prefix, an
attention or MLP module, a projection, a parameter suffix); rules pack split projections into
fused ones, spelled as models spell them (bare ``q_proj``, dotted ``.q_proj``, trailing
``q_proj.``, qualified ``self_attn.q_proj``), in any order. Every fused name contains a split one
as a substring (``v_proj`` in ``qkv_proj``, ``up_proj`` in ``gate_up_proj``), so the old stage's
re-matches come up all the time; a fused name is never a whole component of a split one.
"""

from __future__ import annotations

from hypothesis import strategies as st

PREFIXES = ["", "vision_model.encoder.layers.0.", "model.layers.3.", "vpm.encoder.layers.11.",
            "language_model.model.layers.1.", "vit_merger."]  # fmt: skip
MODULES = ["self_attn.", "attn.", "mlp.", ""]
LEAVES = ["q_proj", "k_proj", "v_proj", "qkv_proj", "kv_proj", "o_proj", "out_proj",
          "gate_proj", "up_proj", "gate_up_proj", "down_proj", "fc1", "q_norm"]  # fmt: skip
SUFFIXES = [".weight", ".bias", ".weight_scale", ".k_scale", ""]

# split projection -> (the fused one it packs into, its shard id)
PACKING = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
SPELLINGS = ("bare", "leading dot", "trailing dot", "qualified")


def spell(split: str, fused: str, how: str) -> tuple[str, str]:
    """A rule's key and target as a model would write them."""
    if how == "leading dot":
        return f".{split}", f".{fused}"
    if how == "trailing dot":
        return f"{split}.", f"{fused}."
    if how == "qualified":
        module = "mlp" if fused == "gate_up_proj" else "self_attn"
        return f"{module}.{split}", f"{module}.{fused}"
    return split, fused


names = st.builds(
    lambda p, m, leaf, s: p + m + leaf + s,
    st.sampled_from(PREFIXES),
    st.sampled_from(MODULES),
    st.sampled_from(LEAVES),
    st.sampled_from(SUFFIXES),
)


@st.composite
def packing_rules(draw) -> dict[str, tuple[str, object]]:
    """One to five packing rules, each spelled its own way, in any order."""
    splits = draw(st.lists(st.sampled_from(sorted(PACKING)), min_size=1, max_size=5, unique=True))
    rules = {}
    for split in draw(st.permutations(splits)):
        fused, shard = PACKING[split]
        key, target = spell(split, fused, draw(st.sampled_from(SPELLINGS)))
        rules[key] = (target, shard)
    return rules


# Rules that chain on purpose: a fused name as a key, a key inside every projection's name.
CHAINED = {
    "qkv_proj": ("qkv", "fused"),
    "kv_proj": ("qkv_proj", "kv"),
    "proj": ("p", 9),
    "self_attn": ("attn", 0),
    "up_proj.weight": ("gate_up_proj.weight", 1),
}


@st.composite
def overlapping_rules(draw) -> dict[str, tuple[str, object]]:
    """``packing_rules`` with up to two chained rules mixed in anywhere."""
    rules = list(draw(packing_rules()).items())
    for key in draw(st.lists(st.sampled_from(sorted(CHAINED)), max_size=2, unique=True)):
        rules.insert(draw(st.integers(0, len(rules))), (key, CHAINED[key]))
    return dict(rules)
