"""One verdict per loader: the report's first line, ``--loader``, the exit status and the JSON."""

from __future__ import annotations

import json
import re
import shutil
from importlib.metadata import version

import pytest
from hf_cases import ARCHS, m_wrapper_prefix, read_tensors, write_variant
from repo_paths import DATA

from loadkit.errors import LoadkitError
from loadkit_inspect import inspect_checkpoint
from loadkit_inspect.cli.main import main
from loadkit_inspect.inspect_report import FIDELITY_POINTER

# Untouched checkpoints transformers loads and vLLM 0.34.0 refuses (docs/fidelity.md), with the
# first line inspect prints for each: the class vLLM would use, then its verdict.
TRANSFORMERS = f"transformers {version('transformers')}"
UNTIED = "2 missing: model.encoder.embed_tokens.weight, model.decoder.embed_tokens.weight"
REFUSED_BY_VLLM = {
    # vLLM 0.34.0 also unties the encoder's and decoder's embed_tokens (docs/fidelity.md)
    "bart": "vllm 0.34.0, TransformersForCausalLM: would NOT load (1 unexpected: "
    f"final_logits_bias; {UNTIED})",
    "mbart": "vllm 0.34.0, TransformersForCausalLM: would NOT load (1 unexpected: "
    f"final_logits_bias; {UNTIED})",
    "deberta-v2": "vllm 0.34.0: would NOT load (vLLM refuses it: Model architectures "
    "['DebertaV2Model'] are not supported for now)",
    "electra": "vllm 0.34.0, TransformersEmbeddingModel: would NOT load (2 missing: "
    "model.embeddings_project.weight, model.embeddings_project.bias)",
    "distilbert-cls": "vllm 0.34.0, TransformersForSequenceClassification: would NOT load (2 "
    "unexpected: pre_classifier.bias, pre_classifier.weight)",
}


@pytest.mark.parametrize("arch", sorted(REFUSED_BY_VLLM))
def test_the_first_lines_say_which_loader_loads_it(arch, hf_clean):
    report = inspect_checkpoint(hf_clean(arch), model="hf")
    # one loader a line when they do not fit on one; a long verdict goes on, indented; then
    # where the disagreement is explained
    head, pointer = report.render().split("\n\n")[0].split("\n(the loaders disagree")
    assert "(the loaders disagree" + pointer == "\n".join(FIDELITY_POINTER)
    first = re.sub(r"\n +", " ", head).splitlines()
    joined = " | ".join(first)
    assert joined == f"{TRANSFORMERS}: would load cleanly | {REFUSED_BY_VLLM[arch]}"
    assert report.loaders is not None
    assert report.loaders["transformers"].clean and not report.loaders["vllm"].clean
    assert (report.clean, report.exit_status) == (False, 1)
    # Each loader alone decides the exit status when selected.
    only_tf = inspect_checkpoint(hf_clean(arch), model="hf", loader="transformers")
    assert (only_tf.clean, only_tf.exit_status) == (True, 0)
    assert (
        only_tf.render().splitlines()[-1] == f"verdict: {TRANSFORMERS}: would load cleanly (exit 0)"
    )
    only_vllm = inspect_checkpoint(hf_clean(arch), model="hf", loader="vllm")
    assert only_vllm.exit_status == 1 and only_vllm.from_pretrained is None


def test_model_prefix_loads_in_vllm_and_leaves_transformers_empty(hf_clean, tmp_path):
    """The issue's example: a BertModel checkpoint with ``model.`` before every key."""
    clean = hf_clean("bert")
    tensors = m_wrapper_prefix(ARCHS["bert"], read_tensors(clean))
    folder = write_variant(clean, tensors, tmp_path / "prefixed")
    # vLLM 0.34.0 serves BertModel natively (not modelled here): its Transformers backend
    report = inspect_checkpoint(folder, model="hf", model_impl="transformers")
    assert report.loaders is not None and report.from_pretrained is not None
    assert report.loaders["vllm"].clean and not report.loaders["transformers"].clean
    fp = report.from_pretrained
    assert set(fp.unexpected) == set(tensors) and len(fp.missing) == len(tensors)
    assert report.exit_status == 1
    assert "\n".join(FIDELITY_POINTER) in report.render()
    only_vllm = inspect_checkpoint(folder, model="hf", loader="vllm", model_impl="transformers")
    assert only_vllm.exit_status == 0


def test_loaders_that_disagree_point_at_the_explanation(hf_clean):
    """Issue 39: "vllm: would NOT load" with no pointer to docs/fidelity.md, which explains it."""
    report = inspect_checkpoint(hf_clean("bart"), model="hf")
    assert not report.loaders["vllm"].clean and report.loaders["transformers"].clean
    first = report.render().split("\n\n")[0]
    assert first.endswith("\n".join(FIDELITY_POINTER))
    fidelity = (DATA.parent / "docs" / "fidelity.md").read_text()
    assert "### Where the two loaders differ" in fidelity
    assert "**BART, mBART: `final_logits_bias` unexpected.**" in fidelity
    agree = inspect_checkpoint(hf_clean("bert"), model="hf")
    assert "the loaders disagree" not in agree.render()


def test_loaders_that_both_fail_do_not_disagree(hf_clean, tmp_path):
    """A final norm missing: transformers initialises it at random, vLLM refuses the load; both
    fail, so no pointer to why the two loaders differ."""
    tensors = read_tensors(hf_clean("llama"))
    del tensors["model.norm.weight"]
    report = inspect_checkpoint(
        write_variant(hf_clean("llama"), tensors, tmp_path / "v"), model="hf"
    )
    assert not report.loaders["vllm"].clean and not report.loaders["transformers"].clean
    assert "the loaders disagree" not in report.render()


def test_gpt_neox_loads_in_vllm_0_34_0_as_transformers_saves_it(hf_clean):
    """vLLM 0.34.0 also takes the renamings registered for the head class AutoModel did not
    build (GPTNeoXForCausalLM's embed_out -> lm_head): both loaders load it."""
    report = inspect_checkpoint(hf_clean("gpt-neox"), model="hf")
    assert report.loaders["vllm"].clean and report.loaders["transformers"].clean
    (key,) = [k for k in report.load.keys if k.name == "embed_out.weight"]
    assert (key.status, key.target) == ("loaded", "lm_head.weight")
    fired = [u for u in report.mapper.rules if u.stage == "renaming" and u.fired]
    assert any(
        "get_checkpoint_conversion_mapping('GPTNeoXForCausalLM')" in (u.origin or "") for u in fired
    ), fired


def test_json_has_both_columns(hf_clean, capsys):
    assert main(["inspect", str(hf_clean("bart")), "--model", "hf", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 8 and doc["selected_loaders"] == ["transformers", "vllm"]
    assert doc["loaders"]["transformers"] == {
        "loader": "transformers",
        "version": version("transformers"),
        "clean": True,
        "outcome": "loads",
        "problems": [],
    }
    assert doc["transformers"]["outcome"] == "loads" and doc["transformers"]["error"] is None
    assert doc["loaders"]["vllm"]["problems"] == ["1 unexpected: final_logits_bias", UNTIED]
    assert doc["transformers"]["class"] == "BartForConditionalGeneration"
    assert doc["transformers"]["missing"] == [] and doc["clean"] is False


def test_a_built_in_model_has_only_the_vllm_loader(capsys):
    path = DATA / "plamo2" / "untied.safetensors"
    report = inspect_checkpoint(path, model="plamo2")
    assert report.loaders is not None and list(report.loaders) == ["vllm"]
    assert not report.render().startswith("vllm:")  # one loader: no side-by-side line
    with pytest.raises(LoadkitError, match="--loader transformers: this model loads only"):
        inspect_checkpoint(path, model="plamo2", loader="transformers")
    assert main(["inspect", str(path), "--model", "plamo2", "--loader", "transformers"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_class_transformers_lacks_is_that_loaders_verdict_only(hf_clean, tmp_path):
    """Remote-code checkpoints name a class transformers does not have (and an ``auto_map`` to
    the code that has it): vLLM would run that code, which loadkit never does, so its column is
    not checked; from_pretrained would stop; the report says both."""
    folder = tmp_path / "custom"
    shutil.copytree(hf_clean("llama"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["MyLlamaForCausalLM"]
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_my.MyLlamaForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config))
    report = inspect_checkpoint(folder, model="hf")
    assert report.loaders is not None
    assert not report.loaders["vllm"].checked and not report.loaders["transformers"].clean

    assert report.loaders["transformers"].problems == [
        f"AttributeError: transformers {version('transformers')} has no model class "
        "'MyLlamaForCausalLM' (the config's architectures[0])"
    ]
    assert report.loaders["transformers"].outcome == "raises"
    assert "remote code for MyLlamaForCausalLM" in report.loaders["vllm"].phrase()
    assert report.exit_status == 1 and report.selected_loaders == ("transformers",)
    with pytest.raises(LoadkitError, match="--loader vllm: no verdict: vLLM 0.34.0 would run"):
        inspect_checkpoint(folder, model="hf", loader="vllm")


def test_an_architecture_nobody_knows_is_one_line(hf_clean, tmp_path, capsys):
    """Neither vLLM 0.34.0 nor transformers knows the architecture (and no remote code is
    named): exit 2, one line naming the file and the nearest known architectures."""
    folder = tmp_path / "custom"
    shutil.copytree(hf_clean("llama"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["LlamaForCasualLM"]
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["inspect", str(folder), "--model", "hf"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{folder / 'config.json'}: architectures[0] 'LlamaForCasualLM': neither vLLM" in err
    assert "nearest known: LlamaForCausalLM" in err


def test_a_class_vllm_adapts_is_not_checked(hf_clean):
    """LlamaForSequenceClassification is not registered in vLLM 0.34.0: it serves it as its
    native LlamaForCausalLM behind the pooling adapter, which loadkit does not model. The vllm
    column says so and only the transformers verdict decides."""
    report = inspect_checkpoint(hf_clean("llama-cls"), model="hf")
    assert report.loaders is not None and report.selected_loaders == ("transformers",)
    vllm = report.loaders["vllm"]
    assert not vllm.checked and vllm.label == (
        "vllm 0.34.0, native LlamaForCausalLM as classify (pooling adapter)"
    )
    assert report.exit_status == 0
    # no load of another class stands in for vLLM's
    assert report.load is None and report.fix is None and report.clean
    assert "load  (vllm loader): not simulated (vllm 0.34.0, native " in report.render()
    first = " ".join(line.strip() for line in report.render().split("\n\n")[0].splitlines())
    assert first.startswith(f"{TRANSFORMERS}: would load cleanly vllm 0.34.0, native ")
    assert "not checked (vLLM 0.34.0 would serve LlamaForSequenceClassification" in first
    # asked for the Transformers backend, it is checked
    backend = inspect_checkpoint(hf_clean("llama-cls"), model="hf", model_impl="transformers")
    assert backend.loaders is not None and backend.loaders["vllm"].checked


def test_what_from_pretrained_initialises_at_random_is_named_not_called_a_failure(
    hf_clean, tmp_path
):
    """Issue 37: a dropped bias, an extra head, a missing pooler: from_pretrained loads, warns,
    and leaves the missing tensors at random; the column says exactly that, with its names."""
    import transformers

    clean = hf_clean("bert")
    tensors = read_tensors(clean)
    dropped = {"pooler.dense.weight", "pooler.dense.bias", "encoder.layer.1.output.dense.bias"}
    kept = {k: v for k, v in tensors.items() if k not in dropped}
    kept["classifier.weight"] = tensors["pooler.dense.weight"][:2].clone()  # a head BertModel lacks
    folder = write_variant(clean, kept, tmp_path / "v")
    _, info = transformers.BertModel.from_pretrained(folder, output_loading_info=True)
    assert sorted(info["missing_keys"]) == sorted(dropped)
    assert sorted(info["unexpected_keys"]) == ["classifier.weight"]
    report = inspect_checkpoint(folder, model="hf", loader="transformers")
    verdict = report.loaders["transformers"]
    assert verdict.outcome == "warns" and report.exit_status == 1
    assert verdict.phrase() == (
        f"{TRANSFORMERS}: would load, but 3 newly initialised at random (MISSING: "
        "encoder.layer.1.output.dense.bias, pooler.dense.bias, pooler.dense.weight); 1 unused "
        "(UNEXPECTED: classifier.weight)"
    )
    assert "would NOT load" not in report.render()


def test_a_class_not_modelled_gets_no_stand_in_probe_or_ranks_only_its_configs_tp_check(hf_clean):
    """OPT is served by vLLM 0.34.0's native OPTForCausalLM, which loadkit does not model: no
    pooling probe or rank of another model answers for it, but vLLM's check of the config for
    --tp comes before any class is built, so a split it refuses is refused here too."""
    opt = hf_clean("opt")  # 2 attention heads
    probed = inspect_checkpoint(opt, model="hf", probe=True)
    assert probed.probe is None and probed.load is None
    assert probed.loaders["vllm"].label == "vllm 0.34.0, native OPTForCausalLM"
    hint = "--model-impl transformers checks the Transformers backend instead"
    assert probed.loaders["vllm"].problems[0].endswith(hint)
    # Falcon's class cannot run on vLLM's attention: the backend would refuse it, so no hint
    falcon = inspect_checkpoint(hf_clean("falcon"), model="hf").loaders["vllm"]
    assert not falcon.checked and "--model-impl" not in falcon.problems[0]
    split = inspect_checkpoint(opt, model="hf", tp=2)
    assert not split.tensor_parallel.simulated and not split.tensor_parallel.ranks
    assert not split.loaders["vllm"].checked and split.exit_status == 0
    assert "tp=2 (the vllm column is not checked: no rank was simulated" in split.render()
    refused = inspect_checkpoint(opt, model="hf", tp=3)
    vllm = refused.loaders["vllm"]
    assert vllm.checked and not vllm.clean and refused.exit_status == 1
    assert vllm.problems[0].startswith("tp=3 refused: Total number of attention heads (2) must")


def test_an_index_naming_a_missing_shard_stops_both_loaders_and_offers_no_rewrite(
    hf_clean, tmp_path
):
    """Both loaders raise before loading a tensor (the index names a shard that is not there):
    they agree, and ``loadkit rename``, which cannot rewrite what cannot be read, is not
    offered."""
    folder = tmp_path / "extra"
    shutil.copytree(hf_clean("llama"), folder)
    path = folder / "model.safetensors.index.json"  # tiny Llama is saved in shards
    index = json.loads(path.read_text())
    index["weight_map"]["extra.weight"] = "model-00099-of-00099.safetensors"
    path.write_text(json.dumps(index))
    report = inspect_checkpoint(folder, model="hf")
    assert report.loaders["transformers"].outcome == "raises"
    assert not report.loaders["vllm"].clean
    assert report.rename_fix is None
    assert "the loaders disagree" not in report.render()


def test_a_fix_for_vllm_is_offered_only_where_vllm_is_asked(hf_clean, tmp_path):
    """Every key without its ``model.`` prefix: vLLM's loader fails and a --mapper fixes it;
    under ``--loader transformers`` (which loads it: transformers adds the prefix itself) no
    vLLM rule is offered."""
    clean = hf_clean("qwen2")  # tied embeddings: the head is not saved
    tensors = {k.removeprefix("model."): v for k, v in read_tensors(clean).items()}
    folder = write_variant(clean, tensors, tmp_path / "bare")
    both = inspect_checkpoint(folder, model="hf")
    assert not both.loaders["vllm"].clean and both.fix is not None
    only = inspect_checkpoint(folder, model="hf", loader="transformers")
    assert only.fix is None and only.not_offered is None and only.exit_status == 0
    assert "suggested fix" not in only.render()
