"""Pairing unused checkpoint keys with missing model tensors (loadkit_inspect.fixes.renames)."""

from loadkit_inspect.fixes import renames
from loadkit_inspect.fixes.renames import Named, Nearest, pair_renames

LAYER = [
    "attention.self.query.weight",
    "attention.self.key.weight",
    "attention.self.value.weight",
    "attention.output.dense.weight",
]


def bert_names(layers=6):
    return [f"encoder.layer.{i}.{p}" for i in range(layers) for p in LAYER]


def test_a_prefix_rename_pairs_every_tensor_with_its_own_key():
    model = bert_names()
    keys = ["bert." + n for n in model]
    pairs = pair_renames([Named(k, k, 64) for k in keys], [Named(n, n, 64) for n in model])
    assert pairs == {n: "bert." + n for n in model}  # not a neighbouring layer's or projection's


def test_suffix_and_middle_renames():
    model = ["ln.weight", "ln.bias", "h.0.attn.weight", "h.1.attn.weight"]
    keys = ["ln.gamma", "ln.beta", "h.0.attention.weight", "h.1.attention.weight"]
    numel = {"ln.weight": 4, "ln.bias": 4, "h.0.attn.weight": 16, "h.1.attn.weight": 16}
    sizes = dict(zip(keys, numel.values(), strict=True))
    pairs = pair_renames(
        [Named(k, k, sizes[k]) for k in keys], [Named(n, n, numel[n]) for n in model]
    )
    assert pairs["h.0.attn.weight"] == "h.0.attention.weight"
    assert pairs["h.1.attn.weight"] == "h.1.attention.weight"
    assert {pairs["ln.weight"], pairs["ln.bias"]} == {"ln.gamma", "ln.beta"}


def test_one_key_per_tensor_and_sizes_must_agree():
    pairs = pair_renames(
        [Named("x.w", "x.w", 4)], [Named("w", "w", 4), Named("y.w", "y.w", 4), Named("z", "z", 5)]
    )
    assert len(pairs) == 1 and list(pairs.values()) == ["x.w"]
    assert pair_renames([Named("x.z", "x.z", 4)], [Named("z", "z", 5)]) == {}


def test_the_pairing_compares_a_bounded_number_of_candidates_per_name(monkeypatch):
    calls = []
    real = renames._score
    monkeypatch.setattr(renames, "_score", lambda a, b: calls.append(1) or real(a, b))
    for layers in (25, 100):
        calls.clear()
        model = bert_names(layers)
        pair_renames([Named("m." + n, n, 64) for n in model], [Named(n, n, 64) for n in model])
        per_name = len(calls) / len(model)
        assert per_name <= 4, (layers, per_name)  # not one comparison per other name


def test_nearest_names_use_shared_parts_and_scan_only_small_sets():
    model = bert_names(2)
    near = Nearest(model, lookups=1)
    assert near("encoder.layer.1.attention.self.qeury.weight")[0] == (
        "encoder.layer.1.attention.self.query.weight"
    )
    assert near("completely.different") == []  # a full scan found nothing alike
    assert near.shortened == 0
    big = Nearest([f"n{i}.w" for i in range(2000)], lookups=1000)
    assert big("zzz") == [] and big.shortened == 1  # counted, so the report can say so


def test_an_equal_shape_breaks_a_tie_between_equally_named_tensors():
    missing = [Named("p.w", "p.w", 16, (2, 8)), Named("q.w", "q.w", 16, (4, 4))]
    assert pair_renames([Named("x.w", "x.w", 16, (4, 4))], missing) == {"q.w": "x.w"}


def test_nearest_names_rank_as_a_full_scoring_would_while_scoring_only_ties():
    """The name likeness is computed only between candidates that share as many components,
    yet the order is the one sorting every candidate by (components shared, likeness) gives."""
    import random

    rng = random.Random(29)
    parts = ["model", "layers", "0", "1", "mlp", "experts", "gate_proj", "weight", "w"]
    for _ in range(3000):
        name = ".".join(rng.choice(parts) for _ in range(rng.randint(1, 6)))
        others = list(
            dict.fromkeys(
                ".".join(rng.choice(parts) for _ in range(rng.randint(1, 6)))
                for _ in range(rng.randint(1, 8))
            )
        )
        full = sorted(others, key=lambda other: renames._score(name, other), reverse=True)
        assert renames._ranked(name, others) == full, (name, others)
    # Three candidates, each sharing a different number of components: no likeness computed.
    assert renames._ranked("a.b.c", ["q.r.s", "a.b.x", "x.y.c"]) == ["a.b.x", "x.y.c", "q.r.s"]
