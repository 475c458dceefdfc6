"""The fused experts' expert mapping (loadkit.parallel.fused_moe): the lookup a hand-written
loader walks instead of every entry gives the entries upstream's loop would try, in its order."""

from hypothesis import given
from hypothesis import strategies as st

from loadkit.parallel.fused_moe import ExpertLookup, build_expert_params_mapping


def upstream(mapping, key):
    """vLLM's loop: every entry, those whose checkpoint name the key lacks skipped."""
    return [entry for entry in mapping if entry[1] in key]


# Pieces of keys where a checkpoint name may hide: inside another word (shared_experts.), twice,
# with ids that prefix each other (1, 11, 110), LoRA's base_layer., fused tensors.
PIECES = ["model.layers.3.", "mlp.", "shared_", "experts.", "1", "11", "110", "0", ".",
          "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3", "gate_up_proj", "base_layer.",
          "weight", "bias", "experts.11.up_proj."]  # fmt: skip


@given(
    key=st.lists(st.sampled_from(PIECES), max_size=12).map("".join),
    experts=st.integers(1, 120),
    redundant=st.integers(0, 5),
    names=st.sampled_from(
        [
            ("gate_proj", "down_proj", "up_proj"),
            ("w1", "w2", "w3"),
            ("gate_up_proj", "down_proj", None),
        ]
    ),
    fused=st.booleans(),
    lora=st.sampled_from(["", "base_layer."]),
)
def test_the_lookup_gives_what_upstreams_loop_tries(key, experts, redundant, names, fused, lora):
    mapping = build_expert_params_mapping(
        *names, experts, redundant, lora_base_layer_prefix=lora, include_fused=fused
    )
    assert ExpertLookup(mapping).matching(key) == upstream(mapping, key)


def test_a_key_holding_two_names_gets_both_in_the_mappings_order():
    mapping = build_expert_params_mapping("gate_proj", "down_proj", "up_proj", 12)
    key = "experts.11.up_proj.experts.1.gate_proj.weight"
    assert [e[1] for e in ExpertLookup(mapping).matching(key)] == [
        "experts.1.gate_proj.",
        "experts.11.up_proj.",
    ]


def test_names_without_a_common_prefix_try_every_entry():
    mapping = [("a_", "x.0.", 0, "w1"), ("b_", "y.0.", 0, "w2")]
    lookup = ExpertLookup(mapping)
    assert lookup.anchor == "" and lookup.matching("m.y.0.weight") == [mapping[1]]
