import json

from hypothesis import given
from hypothesis import strategies as st

from loadkit_inspect.report.layout import MAX_DEPTH, build_layout, treemap_columns

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
    assert any(
        "layers.{0-1,3}" in line and " 3 layers, 5 tensors in all " in line for line in lines
    )
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


def _layer_items(layers=6, odd_shape=None, missing=None):
    items = []
    for i in range(layers):
        items.append((f"enc.layer.{i}.fc.weight", 4, "F32", (16, 8) if i != odd_shape else (8, 16)))
        if i != missing:
            items.append((f"enc.layer.{i}.fc.bias", 4, "F32", (16,)))
    return items


def test_folded_siblings_name_the_odd_layer():
    root = build_layout(_layer_items(odd_shape=3, missing=4), fold=True)
    weight = root.find("enc.layer.{0-5}.fc.weight")
    bias = root.find("enc.layer.{0-5}.fc.bias")
    assert weight.shape == (16, 8) and weight.missing_in == []
    assert [(v.shape, v.dtype, v.places) for v in weight.variants] == [
        ((8, 16), None, ["enc.layer.3"])
    ]
    assert bias.shape == (16,) and bias.variants == [] and bias.missing_in == ["enc.layer.4"]
    assert [n.path for n in root.odd_ones()] == [weight.path, bias.path]
    text = root.render()
    assert "[16, 8]; [8, 16] in enc.layer.3" in text
    assert "[16]; 5 of 6: missing in enc.layer.4" in text
    d = root.find("enc.layer.{0-5}.fc").as_dict()["children"]
    assert d[0]["variants"] == [{"shape": [8, 16], "dtype": None, "in": ["enc.layer.3"]}]
    assert d[1]["missing_in"] == ["enc.layer.4"] and d[1]["shape"] == [16]
    # A uniform fold says nothing more than the shape; unfolding and refolding keeps shapes.
    uniform = build_layout(_layer_items(), fold=True)
    assert list(uniform.odd_ones()) == []
    assert (
        build_layout(_layer_items(missing=4)).folded().as_dict()
        == build_layout(_layer_items(missing=4), fold=True).as_dict()
    )


def test_nested_folds_and_dtypes():
    items = [
        (f"layers.{i}.experts.{j}.w", 2, "BF16" if (i, j) != (0, 1) else "F16", (2,))
        for i in range(2)
        for j in range(3)
        if (i, j) != (1, 2)
    ]
    items.append(("layers.1.experts.2.v", 2, "BF16", (2,)))  # expert 2 of layer 1 exists
    w = build_layout(items, fold=True).find("layers.{0-1}.experts.{0-2}.w")
    assert w.missing_in == ["layers.1.experts.2"]
    assert [(v.dtype, v.places, v.usual) for v in w.variants] == [
        ("F16", ["layers.0.experts.1"], "BF16")
    ]


def test_a_tensor_most_instances_lack_names_the_few_that_have_it():
    items = [(f"l.{i}.w", 4, "F32", (2,)) for i in range(300)]
    items += [(f"l.{i}.extra_{i}", 4, "F32", (2,)) for i in range(300)]  # one per layer
    root = build_layout(items, fold=True)
    extra = root.find("l.{0-299}.extra_7")
    assert extra.only_in == ["l.7"] and extra.of == 300 and extra.missing_in == []
    assert "1 of 300: only in l.7" in extra.shape_text()
    # Each tensor names the smaller side: 300 places in all, not 300 x 299.
    assert sum(len(n.only_in) + len(n.missing_in) for n in root.walk()) == 300


def test_a_fold_says_how_many_instances_of_how_many_tensors():
    names = [(f"encoder.layer.{i}.{p}.weight", 4, "F32") for i in range(6) for p in "abcd"]
    names += [(f"experts.{i}.w", 4, "F32") for i in range(8)] + [("x.weight", 4, "F32")]
    lines = build_layout(names, fold=True).render().splitlines()
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in lines}
    assert rows["encoder.layer.{0-5}"].startswith("6 layers x 4 tensors 96 B")  # not "24 x6"
    assert rows["experts.{0-7}"].startswith("8 experts x 1 tensor 32 B")
    assert rows["x.weight"].startswith("1 tensor 4 B")  # singular


# Names that take every branch of the build: folds with a gap and a zero-padded number, nested
# folds, shape and dtype variants, a tensor most instances lack and one a few lack, a numbered
# last component, an 18- and a 19-digit component, a folded label also spelled literally (either
# first), an empty component, the same name more than once (at a folded and an unfolded node),
# a name that is also a prefix, shapes as lists and missing.
EVERY_BRANCH = [
    ("embed.weight", 8, "F32", (2, 1)),
    ("layers.0.attn.w", 4, "F32", (1,)),
    ("layers.0.experts.0.w", 2, "BF16", [1]),
    ("layers.0.experts.1.w", 2, "BF16", (1,)),
    ("layers.1.attn.w", 4, "F32", (1,)),
    ("layers.1.experts.0.w", 2, "F16", (1,)),
    ("layers.1.experts.1.w", 2, "BF16", (2,)),
    ("layers.3.attn.w", 4, "F32", (3,)),
    ("layers.3.extra", 4, "F32", (1,)),
    ("layers.{0}.x", 1, "F32", None),
    ("layers.007.attn.w", 4, "F32", (1,)),
    ("experts.3", 1, "I8", (1,)),
    ("experts.5", 1, "I8", (1,)),
    ("ids.1234567890123456789.w", 1, "F32"),
    ("ids.123456789012345678.w", 1, "F32"),
    ("embed.weight", 8, "F32", (2, 1)),
    ("embed", 1, "F32", ()),
    ("a..b", 1, "F32", (1,)),
    ("layers.0.mlp.w", 2, "F32", (2,)),
    ("layers.1.mlp.w", 2, "F32", (2,)),
    ("layers.3.mlp.w", 2, "F32", (2,)),
    ("heads.0.w", 1, "F32", (1,)),
    ("heads.{0}.v", 1, "F32", (1,)),
    ("bias.{0}", 1, "F32", (1,)),
    ("bias.0", 1, "F32", (1,)),
    ("norm", 2, "F32", (4,)),
    ("norm", 2, "BF16", (5,)),
    ("norm", 2, "BF16", [5]),
]

EVERY_BRANCH_FOLDED = [  # rows of render(), hand-checked
    "embed                          3 tensors                   17 B  F32 3  []",
    "  weight                       2 tensors                   16 B  F32 2  [2, 1]",
    "layers                        13 tensors                   35 B  BF16 3, F16 1, F32 9",
    "  {0-1,3,7}                    4 layers x 3 tensors        34 B  BF16 3, F16 1, F32 8",
    "    attn.w                     4 tensors                   16 B  F32 4  [1]; [3] in layers.3",
    "    experts.{0-1}              2 experts x 2 tensors        8 B  BF16 3, F16 1",
    "      w                        4 tensors                    8 B  BF16 3, F16 1  "
    "[1]; F16 in layers.1.experts.0; [2] in layers.1.experts.1",
    "    extra                      1 tensor                     4 B  F32 1  "
    "[1]; 1 of 4: only in layers.3",
    "    mlp.w                      3 tensors                    6 B  F32 3  "
    "[2]; 3 of 4: missing in layers.7",
    "  {0}.x                        1 tensor                     1 B  F32 1",
    "experts.{3,5}                  2 experts x 1 tensor         2 B  I8 2  [1]",
    "ids                            2 tensors                    2 B  F32 2",
    "  1234567890123456789.w        1 tensor                     1 B  F32 1",
    "  {123456789012345678}.w       1 tensor                     1 B  F32 1",
    "a..b                           1 tensor                     1 B  F32 1  [1]",
    "heads                          2 tensors                    2 B  F32 2",
    "  {0}.w                        1 tensor                     1 B  F32 1  [1]",
    "  {0}'.v                       1 tensor                     1 B  F32 1  [1]",
    "bias                           2 tensors                    2 B  F32 2",
    "  {0}                          1 tensor                     1 B  F32 1  [1]",
    "  {0}'                         1 tensor                     1 B  F32 1  [1]",
    "norm                           3 tensors                    6 B  BF16 2, F32 1  [5]",
]


def test_a_folded_tree_of_names_that_take_every_branch():
    root = build_layout(EVERY_BRANCH, fold=True)
    assert [row.rstrip() for row in root.render().splitlines()] == EVERY_BRANCH_FOLDED
    assert [(n.path, n.own, n.shape, n.dtypes) for n in root.walk() if n.own][-3:] == [
        ("bias.{0}", (1, 1, "F32"), (1,), {"F32": 1}),
        ("bias.{0}'", (1, 1, "F32"), (1,), {"F32": 1}),  # bias.0, after the literal {0}
        ("norm", (3, 6, "BF16"), (5,), {"F32": 1, "BF16": 2}),  # the first most common shape
    ]
    w = root.find("layers.{0-1,3,7}.experts.{0-1}.w")
    assert [(v.shape, v.dtype, v.places, v.usual) for v in w.variants] == [
        (None, "F16", ["layers.1.experts.0"], "BF16"),
        ((2,), None, ["layers.1.experts.1"], "[1]"),
    ]
    assert (w.tensors, w.nbytes, w.of, w.missing_in, w.only_in) == (4, 8, 4, [], [])
    extra = root.find("layers.{0-1,3,7}.extra")
    assert (extra.only_in, extra.of, extra.missing_in) == (["layers.3"], 4, [])
    mlp = root.find("layers.{0-1,3,7}.mlp.w")
    assert (mlp.missing_in, mlp.of, mlp.only_in) == (["layers.7"], 4, [])
    assert [n.path for n in root.odd_ones()] == [
        "layers.{0-1,3,7}.attn.w",
        "layers.{0-1,3,7}.experts.{0-1}.w",
        "layers.{0-1,3,7}.extra",
        "layers.{0-1,3,7}.mlp.w",
    ]
    experts = root.find("experts.{3,5}")
    assert (experts.is_tensor, experts.instances, experts.own) == (True, 2, (2, 2, "I8"))
    assert root.as_dict()["children"][-1] == {
        "name": "norm",
        "path": "norm",
        "tensors": 3,
        "bytes": 6,
        "dtypes": {"BF16": 2, "F32": 1},
        "is_tensor": True,
        "shape": [5],
    }
    assert treemap_columns(root)["ids"][-3:] == [
        "(checkpoint)/bias/{0}",
        "(checkpoint)/bias/{0}'",
        "(checkpoint)/norm",
    ]


def test_an_unfolded_tree_keeps_every_name():
    items = [(n, b, d) for n, b, d, *_ in EVERY_BRANCH if n not in ("embed.weight", "norm")]
    root = build_layout(items)
    assert sorted(root.leaves()) == sorted(items)
    assert [name for name, _, _ in root.leaves()][:12] == [  # depth first, as names appear
        "layers.0.attn.w",
        "layers.0.experts.0.w",
        "layers.0.experts.1.w",
        "layers.0.mlp.w",
        "layers.1.attn.w",
        "layers.1.experts.0.w",
        "layers.1.experts.1.w",
        "layers.1.mlp.w",
        "layers.3.attn.w",
        "layers.3.extra",
        "layers.3.mlp.w",
        "layers.{0}.x",
    ]
    assert root.find("layers.007.attn.w").path == "layers.007.attn.w"
    assert list(root.find("layers").children) == ["0", "1", "3", "{0}", "007"]
    assert root.find("norm") is None


def test_a_name_longer_than_max_depth_keeps_its_tail_as_one_component():
    long = ".".join(["d"] * (MAX_DEPTH - 1) + ["7", "8"])
    items = [(long, 1, "F32", (1,)), ("d.0.w", 1, "F32", (1,))]
    for fold in (False, True):
        root = build_layout(items, fold=fold)
        node = root.find(long)
        assert node is not None and node.name == "7.8" and node.is_tensor
        assert node.path == long and node.own == (1, 1, "F32")
    assert list(build_layout(items).leaves()) == [(long, 1, "F32"), ("d.0.w", 1, "F32")]
    assert build_layout(items, fold=True).find("d.{0}.w").tensors == 1
