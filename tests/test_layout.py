import json

from hypothesis import given
from hypothesis import strategies as st

from loadkit.inspection.layout import build_layout, fmt_bytes, treemap_columns

NAMES = [
    ("model.embed_tokens.weight", 64, "F32"),
    ("model.layers.0.self_attn.q_proj.weight", 16, "F32"),
    ("model.layers.0.mlp.up_proj.weight", 32, "BF16"),
    ("model.layers.1.self_attn.q_proj.weight", 16, "F32"),
    ("model.layers.1.mlp.up_proj.weight", 32, "BF16"),
    ("model.layers.3.self_attn.q_proj.weight", 16, "F32"),
    ("model.norm.weight", 4, "F32"),
    ("lm_head.weight", 64, "F32"),
]


def test_counts_bytes_and_dtypes_per_node():
    root = build_layout(NAMES)
    assert (root.tensors, root.nbytes) == (8, 244)
    layers = root.find("model.layers")
    assert (layers.tensors, layers.nbytes, layers.dtypes) == (5, 112, {"F32": 3, "BF16": 2})
    assert list(layers.children) == ["0", "1", "3"]
    leaf = root.find("model.layers.0.mlp.up_proj.weight")
    assert leaf.is_tensor and leaf.path == "model.layers.0.mlp.up_proj.weight"
    assert (leaf.tensors, leaf.nbytes, leaf.dtypes) == (1, 32, {"BF16": 1})
    assert root.find("model.nothing") is None
    assert list(root.children) == ["model", "lm_head"]  # the order names first appear


def test_folding_merges_numbered_siblings_and_shows_gaps():
    folded = build_layout(NAMES, fold=True)
    node = folded.find("model.layers.{0-1,3}")
    assert node is not None and node.instances == 3
    assert (node.tensors, node.nbytes) == (5, 112)
    q = folded.find("model.layers.{0-1,3}.self_attn.q_proj.weight")
    assert (q.tensors, q.instances) == (3, 1)  # only the folded label carries instances
    assert folded.find("model.layers.{0-1,3}.mlp.up_proj.weight").tensors == 2
    # Folding the full tree gives the same as folding while building.
    assert build_layout(NAMES).folded().as_dict() == folded.as_dict()


def test_nested_numbers_fold_per_level():
    names = [
        (f"layers.{i}.experts.{e}.w{k}", 1, "F32")
        for i in range(4)
        for e in range(8)
        for k in (1, 2)
    ]
    folded = build_layout(names, fold=True)
    experts = folded.find("layers.{0-3}.experts.{0-7}")
    assert (experts.tensors, experts.instances) == (64, 8)
    assert folded.find("layers.{0-3}").instances == 4


def test_a_name_that_is_also_a_prefix():
    root = build_layout([("a", 1, "F32"), ("a.b", 2, "F16")])
    a = root.find("a")
    assert a.is_tensor and a.tensors == 2 and a.nbytes == 3
    assert sorted(root.leaves()) == [("a", 1, "F32"), ("a.b", 2, "F16")]


def test_render_joins_single_child_chains_and_caps_children():
    text = build_layout(NAMES, fold=True).render()
    lines = text.splitlines()
    assert lines[0].startswith("model ")
    assert any(line.strip().startswith("embed_tokens.weight") for line in lines)
    assert any("layers.{0-1,3}" in line and "x3" in line for line in lines)
    wide = build_layout([(f"w{i}", 1, "F32") for i in range(50)]).render(max_children=10)
    assert "... 40 more" in wide
    shallow = build_layout(NAMES).render(max_depth=1)
    assert "q_proj" not in shallow


def test_as_dict_is_json_and_treemap_columns_are_consistent():
    root = build_layout(NAMES)
    json.dumps(root.as_dict())
    cols = treemap_columns(root)
    n = len(cols["ids"])
    assert all(len(v) == n for v in cols.values())
    assert len(set(cols["ids"])) == n
    assert cols["parents"][0] == "" and cols["values"][0] == 244
    ids = set(cols["ids"])
    assert all(p in ids for p in cols["parents"][1:])
    # Each node's value is at least the sum of its children's (branchvalues="total").
    for i, node_id in enumerate(cols["ids"]):
        below = sum(v for v, p in zip(cols["values"], cols["parents"], strict=True) if p == node_id)
        assert cols["values"][i] >= below


def test_fmt_bytes():
    assert fmt_bytes(0) == "0 B"
    assert fmt_bytes(1023) == "1023 B"
    assert fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(64 << 30) == "64 GiB"


name_part = st.sampled_from(["model", "layers", "0", "1", "12", "mlp", "w", "bias", "x"])


@given(
    st.dictionaries(
        st.lists(name_part, min_size=1, max_size=5).map(".".join),
        st.tuples(st.integers(0, 10**12), st.sampled_from(["F32", "BF16", "I64"])),
        max_size=40,
    )
)
def test_totals_are_conserved_folded_or_not(tensors):
    items = [(n, b, d) for n, (b, d) in tensors.items()]
    for fold in (False, True):
        root = build_layout(items, fold=fold)
        assert root.tensors == len(items)
        assert root.nbytes == sum(b for _, b, _ in items)
        assert sum(root.dtypes.values()) == len(items)
        for node in root.walk():
            assert node.tensors >= sum(c.tensors for c in node.children.values())
    assert sorted(build_layout(items).leaves()) == sorted(items)
