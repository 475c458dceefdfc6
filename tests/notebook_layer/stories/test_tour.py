"""Notebook 00's story (the tour), on the notebook's own functions."""

from notebook_code import notebook_namespace

from loadkit import AutoWeightsLoader, open_checkpoint
from loadkit_inspect.inspector import inspect_checkpoint
from loadkit_notebooks.stories import tour


def test_tour_steps(in_notebooks, tmp_path):
    from loadkit import CopyCounter, ledger_of
    from loadkit_notebooks.fates import FATE_COLOURS

    ns = notebook_namespace("00_tour.ipynb")
    path = ns["write_checkpoint"](str(tmp_path / "tiny.safetensors"))
    ck = open_checkpoint(path)
    model = ns["TinyHybrid"]()
    with CopyCounter() as copies:  # the load the tour makes in its own cell
        model.load_weights(ck.weights())
    ledger = ledger_of(model)
    counts = ledger.counts()["checkpoint"]
    assert (counts["loaded"], counts["skipped"], counts["dropped by mapper"]) == (11, 1, 1)
    assert ledger.never_loaded == []
    assert copies.count == 12  # one per loaded name, and A's composed loader copies twice
    side = tour.side_by_side(ck, model)
    assert "names in common: none" in side
    traces = tour.trace_table(model.hf_to_vllm_mapper, list(ck.tensors))
    assert "-> DROPPED" in traces and "[shard 'k']" in traces
    aliases = AutoWeightsLoader(model).aliased_params  # the tied lm_head.weight
    walk = tour.walk_picture(model.hf_to_vllm_mapper, list(ck.tensors), skipped=aliases)
    assert walk.splitlines()[0] == "model  (11 names)" and "qkv_proj  (3 names)" in walk
    # what the loader skips never enters the walk: not drawn as walked, said after the tree
    assert "\nlm_head" not in walk
    assert walk.splitlines()[-1] == (
        "(skipped before the walk, tied-embedding aliases: lm_head.weight)"
    )
    head = tour.journey("lm_head.weight", ck, model, ledger)
    assert "walk        none: lm_head.weight is skipped before the walk" in head
    assert " -> weight" not in head
    journey = tour.journey("backbone.layers.0.mixer.A_log", ck, model, ledger)
    assert "composed_weight_loader(default_weight_loader)" in journey
    assert journey.endswith("ledger      loaded -> model.layers.0.mixer.A")
    assert "ckpt: mtp -> dropped by mapper: 1" in tour.sankey_data(ledger)
    assert "qkv_weight_loader" in tour.loader_table(model)
    # q, k and v landed in their own rows of the packed parameter
    qkv = model.get_parameter("model.layers.1.mixer.qkv_proj.weight")
    tensors = dict(ck.weights())
    for i, p in enumerate("qkv"):
        assert qkv[8 * i : 8 * (i + 1)].equal(tensors[f"backbone.layers.1.mixer.{p}_proj.weight"])
    report = inspect_checkpoint(path, model=ns["TinyHybrid"], probe=True)
    assert report.clean and not report.probe["old"].hit and report.probe["new"].walked == 1
    # the Sankey's fates have the fate palette: "loaded" is never a warning colour
    (sankey,) = tour.sankey_figure(ledger).data
    colours = dict(zip(sankey.node.label, sankey.node.color, strict=True))
    assert colours["loaded"] == FATE_COLOURS["loaded"]
    assert colours["skipped"] == FATE_COLOURS["skipped"]
    assert colours["dropped by mapper"] == FATE_COLOURS["dropped by mapper"]
