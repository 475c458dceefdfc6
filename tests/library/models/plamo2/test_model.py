"""Plamo2 (vLLM #41699): the four loader behaviours against each other and against arithmetic."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from loadkit import AutoWeightsLoader, ledger_of
from loadkit.errors import LoadkitError, ShapeMismatchError, UnknownNameError
from loadkit.models.plamo2 import (
    BEHAVIOURS,
    Plamo2Config,
    Plamo2ForCausalLM,
    Plamo2Model,
    make_checkpoint,
)

# Spelled out here, not imported: the tests check the library against these.
FIVE_SUBMODULE_NORMS = ("B_norm.weight", "C_norm.weight", "dt_norm.weight", "q_norm.weight",
                        "k_norm.weight")  # fmt: skip
LAYER_OFFSETS = {
    "pre_mixer_norm.weight": 1.0,
    "post_mixer_norm.weight": 0.2,
    "pre_mlp_norm.weight": 1.0,
    "post_mlp_norm.weight": 5**-1.5,
}


def copies(ckpt):
    return [(k, v.clone()) for k, v in ckpt.items()]


def loaded_state(config, ckpt, behaviour):
    model = Plamo2ForCausalLM(config, behaviour=behaviour)
    model.load_weights(copies(ckpt))
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def differing(a, b):
    return {k for k in a if not torch.equal(a[k], b[k])}


CONFIGS = [
    Plamo2Config(),
    Plamo2Config(tie_word_embeddings=True),
    Plamo2Config(num_hidden_layers=5, mamba_step=3, mamba_num_heads=4, hidden_size_per_head=2),
    Plamo2Config(num_hidden_layers=4, tie_word_embeddings=True, num_key_value_heads=1),
]


def test_upstream_structure_and_names():
    model = Plamo2ForCausalLM(Plamo2Config())
    names = dict(model.named_parameters())
    assert type(model.model).__name__ == "Plamo2Model"
    assert isinstance(model.model.layers.layers, torch.nn.ModuleList)
    assert "model.layers.layers.0.mixer.A" in names
    assert "model.layers.layers.1.mixer.q_norm.weight" in names
    assert names["model.layers.layers.1.mixer.q_norm.weight"].shape == (4, 4)
    assert names["model.layers.layers.0.mixer.in_proj.weight"].shape == (24, 16)
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} <= names.keys()


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_old_and_new_give_identical_state_dicts(config):
    ckpt = make_checkpoint(config, seed=3)
    old, new = loaded_state(config, ckpt, "old"), loaded_state(config, ckpt, "new")
    assert old.keys() == new.keys()
    assert differing(old, new) == set()
    assert ("lm_head.weight" in old) == (not config.tie_word_embeddings)


@pytest.mark.parametrize("tied", [False, True])
def test_rotary_names_skipped_by_both(tied):
    # Old skipped them itself; new relies on AutoWeightsLoader's always-skipped rotary names.
    config = Plamo2Config(tie_word_embeddings=tied)
    ckpt = make_checkpoint(config, include_rotary=True)
    assert any("rotary_emb.inv_freq" in k for k in ckpt)
    assert differing(loaded_state(config, ckpt, "old"), loaded_state(config, ckpt, "new")) == set()


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_moved_verbatim_differs_only_in_final_norm_by_exactly_one(config):
    ckpt = make_checkpoint(config)
    new, moved = loaded_state(config, ckpt, "new"), loaded_state(config, ckpt, "moved-verbatim")
    assert differing(new, moved) == {"model.norm.weight"}
    shift = new["model.norm.weight"] - moved["model.norm.weight"]
    assert torch.equal(shift, torch.ones_like(shift))


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_loose_match_differs_only_in_submodule_norms_each_by_exactly_one(config):
    ckpt = make_checkpoint(config)
    new, loose = loaded_state(config, ckpt, "new"), loaded_state(config, ckpt, "loose-match")
    expected = {k for k in new if k.endswith(FIVE_SUBMODULE_NORMS)}
    n_mamba = config.layer_kinds.count("mamba")
    assert len(expected) == 3 * n_mamba + 2 * (config.num_hidden_layers - n_mamba)
    assert differing(new, loose) == expected
    for k in expected:
        shift = loose[k] - new[k]
        assert torch.equal(shift, torch.ones_like(shift)), k


def expected_in_proj(ckpt_weight, heads):
    """Row r of the loaded weight, by explicit per-head index arithmetic, element by element."""
    rows, cols = ckpt_weight.shape
    head_rows = rows // heads  # per head: gate half, then hidden-state half
    half = head_rows // 2
    out = torch.empty_like(ckpt_weight)
    for r in range(rows):
        part, within = divmod(r, rows // 2)  # part 0: all gates, part 1: all hidden states
        head, j = divmod(within, half)
        src = head * head_rows + part * half + j
        for c in range(cols):
            out[r, c] = ckpt_weight[src, c]
    return out


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_in_proj_reorder_matches_index_arithmetic(behaviour):
    config = Plamo2Config(num_hidden_layers=3, mamba_step=3)  # layers 0 and 2 are mamba
    ckpt = make_checkpoint(config, seed=5)
    state = loaded_state(config, ckpt, behaviour)
    for i in (0, 2):
        key = f"model.layers.layers.{i}.mixer.in_proj.weight"
        assert torch.equal(state[key], expected_in_proj(ckpt[key], config.mamba_num_heads))
        assert not torch.equal(state[key], ckpt[key])  # a real reorder, not the identity


@given(
    heads=st.integers(1, 4),
    head_dim=st.integers(1, 4),
    hidden=st.integers(1, 6),
)
def test_in_proj_reorder_property(heads, head_dim, hidden):
    config = Plamo2Config(
        hidden_size=hidden,
        mamba_num_heads=heads,
        hidden_size_per_head=head_dim,
        num_attention_heads=1,
        num_key_value_heads=1,
    )
    ckpt = make_checkpoint(config)
    key = "model.layers.layers.0.mixer.in_proj.weight"
    assert ckpt[key].shape == (2 * heads * head_dim, hidden)
    got = loaded_state(config, ckpt, "new")[key]
    assert torch.equal(got, expected_in_proj(ckpt[key], heads))


def test_norm_offsets_and_A():
    config = Plamo2Config(num_hidden_layers=4)
    ckpt = make_checkpoint(config)
    state = loaded_state(config, ckpt, "new")
    for key, value in state.items():
        suffix = key.split(".", 4)[-1]
        if suffix in LAYER_OFFSETS:
            assert torch.equal(value, ckpt[key] + LAYER_OFFSETS[suffix]), key
    assert torch.equal(state["model.norm.weight"], ckpt["model.norm.weight"] + 1.0)
    a_log = ckpt["model.layers.layers.0.mixer.A_log"]
    assert torch.equal(state["model.layers.layers.0.mixer.A"], -torch.exp(a_log))
    assert torch.equal(state["model.layers.layers.1.mixer.q_norm.weight"],
                       ckpt["model.layers.layers.1.mixer.q_weight"])  # fmt: skip


def test_offsets_are_added_in_place_to_the_tensors_handed_over():
    # Upstream mutates what it is handed; callers that need the checkpoint pass copies.
    config = Plamo2Config()
    ckpt = make_checkpoint(config)
    pristine = {k: v.clone() for k, v in ckpt.items()}
    Plamo2ForCausalLM(config, behaviour="new").load_weights(ckpt.items())
    key = "model.layers.layers.0.pre_mixer_norm.weight"
    assert torch.equal(ckpt[key], pristine[key] + 1.0)
    assert torch.equal(ckpt["model.norm.weight"], pristine["model.norm.weight"] + 1.0)
    in_proj = "model.layers.layers.0.mixer.in_proj.weight"
    assert torch.equal(ckpt[in_proj], pristine[in_proj])  # the reorder builds a new tensor
    # A second load of the same (now mutated) dict is off by the offset again: hence copies.
    second = loaded_state(config, ckpt, "new")
    assert torch.equal(second[key], pristine[key] + 2.0)


def test_return_values_and_ledgers():
    config = Plamo2Config()
    ckpt = make_checkpoint(config)
    old = Plamo2ForCausalLM(config, behaviour="old")
    assert old.load_weights(copies(ckpt)) is None  # upstream's old loader returned nothing
    new = Plamo2ForCausalLM(config, behaviour="new")
    names = new.load_weights(copies(ckpt))
    assert names == {n for n, _ in new.named_parameters()}
    lo, ln = ledger_of(old), ledger_of(new)
    assert lo.never_loaded == [] and ln.never_loaded == []
    assert {e.status for e in lo.entries} == {"loaded"}
    assert lo.params["model.layers.layers.0.mixer.A"].sources == [
        "model.layers.layers.0.mixer.A_log"
    ]
    assert ln.counts()["checkpoint"]["delegated"] == len(ckpt) - 1  # all but lm_head


def test_tied_lm_head_handling():
    config = Plamo2Config(tie_word_embeddings=True)
    ckpt = make_checkpoint(config)
    assert "lm_head.weight" not in ckpt  # as published tied checkpoints are
    with_head = make_checkpoint(config, include_lm_head=True)
    assert torch.equal(with_head["model.embed_tokens.weight"], ckpt["model.embed_tokens.weight"])
    embed, head = with_head["model.embed_tokens.weight"], with_head["lm_head.weight"]
    for behaviour in BEHAVIOURS:
        model = Plamo2ForCausalLM(config, behaviour=behaviour)
        assert model.lm_head.weight is model.model.embed_tokens.weight
        model.load_weights(copies(with_head))
        assert torch.equal(model.model.embed_tokens.weight, embed), behaviour
        entry = next(e for e in ledger_of(model).entries if e.name == "lm_head.weight")
        assert entry.status == "skipped"
    # Without skip_prefixes, lm_head.weight streamed after the embedding overwrites it.
    model = Plamo2ForCausalLM(config)
    AutoWeightsLoader(model).load_weights(copies(with_head))
    assert torch.equal(model.model.embed_tokens.weight, head)
    assert ledger_of(model).params["model.embed_tokens.weight"].sources == ["lm_head.weight"]


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_unknown_name_raises_a_loadkit_error_naming_it(behaviour):
    config = Plamo2Config()
    weights = [("model.layers.layers.0.mixer.in_projj.weight", torch.zeros(24, 16))]
    with pytest.raises(UnknownNameError) as info:
        Plamo2ForCausalLM(config, behaviour=behaviour).load_weights(weights)
    assert not isinstance(info.value, KeyError)
    msg = str(info.value)
    assert "model.layers.layers.0.mixer.in_projj.weight" in msg
    assert "model.layers.layers.0.mixer.in_proj.weight" in msg  # the nearest real name


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_shape_mismatch_names_parameter_and_shapes(behaviour):
    config = Plamo2Config()
    for key, bad in [
        ("model.layers.layers.0.mixer.in_proj.weight", (16, 24)),
        ("model.layers.layers.1.pre_mlp_norm.weight", (15,)),
    ]:
        with pytest.raises(ShapeMismatchError) as info:
            Plamo2ForCausalLM(config, behaviour=behaviour).load_weights([(key, torch.zeros(bad))])
        msg = str(info.value)
        assert key in msg and str(list(bad)) in msg


def test_bad_behaviour_and_inner_loader_of_old():
    with pytest.raises(LoadkitError, match="behaviour"):
        Plamo2ForCausalLM(Plamo2Config(), behaviour="newer")
    with pytest.raises(LoadkitError, match="no load_weights"):
        Plamo2Model(Plamo2Config(), behaviour="old").load_weights([])


def test_load_trace_shows_what_each_level_saw():
    config = Plamo2Config()
    ckpt = make_checkpoint(config)
    moved = Plamo2ForCausalLM(config, behaviour="moved-verbatim")
    moved.load_weights(copies(ckpt))
    step = next(s for s in moved.model.load_trace if s.received == "norm.weight")
    assert step.final_norm_test is False and step.offset is None
    old = Plamo2ForCausalLM(config, behaviour="old")
    old.load_weights(copies(ckpt))
    step = next(s for s in old.load_trace if s.received == "model.norm.weight")
    assert step.final_norm_test is True and step.offset == 1.0


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_constructible_on_meta(behaviour):
    with torch.device("meta"):
        model = Plamo2ForCausalLM(
            Plamo2Config(num_hidden_layers=6, vocab_size=10**6), behaviour=behaviour
        )
    assert all(p.is_meta for p in model.parameters())
