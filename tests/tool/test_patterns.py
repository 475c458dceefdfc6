"""Load rules match either spelling of a name; a pattern that matched nothing is said (issue 24).

A user copies names from the checkpoint (``bert.pooler.dense.bias``) as often as from the
report's model side (``model.pooler.dense.bias`` for ``--model hf``, whose wrapper holds the
transformers model as ``self.model``). The checkpoint is a BertForSequenceClassification that
transformers saved, then mutated: no pooler and no classifier (a fresh head), one extra tensor
under an existing module and one under a module the model lacks.
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from loadkit_inspect.inspector import inspect_checkpoint
from loadkit_inspect.options import LoadRules

POOLER = ["model.pooler.dense.weight", "model.pooler.dense.bias"]
HEAD = ["classifier.weight", "classifier.bias"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory, quiet_transformers):
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        vocab_size=64, max_position_embeddings=32, num_labels=3,
        architectures=["BertForSequenceClassification"],
    )  # fmt: skip
    root = tmp_path_factory.mktemp("bert-patterns")
    transformers.BertForSequenceClassification(config).save_pretrained(root / "saved")
    tensors = load_file(root / "saved" / "model.safetensors")
    kept = {k: v for k, v in tensors.items() if not k.startswith(("bert.pooler.", "classifier."))}
    kept["bert.embeddings.extra.weight"] = torch.zeros(4)  # under a module the model has
    kept["cls.predictions.bias"] = torch.zeros(64)  # under one it lacks
    folder = root / "no-head"
    folder.mkdir()
    shutil.copy(root / "saved" / "config.json", folder / "config.json")
    save_file(kept, folder / "model.safetensors")
    return folder


def _inspect(folder, **rules):
    return inspect_checkpoint(
        folder, model="hf", model_impl="transformers", loader="vllm", rules=LoadRules(**rules)
    )


def _fates(report):
    return {k.name: (k.status, k.rule) for k in report.load.keys}


def test_the_two_spellings_differ_by_the_wrappers_prefix(bert):
    r = _inspect(bert)
    assert sorted(m.name for m in r.load.missing) == sorted(POOLER + HEAD)
    mapped = {k.name: k.mapped for k in r.load.keys}
    assert mapped["bert.encoder.layer.1.output.dense.bias"] == (
        "model.encoder.layer.1.output.dense.bias"
    )
    assert {u.name for u in r.load.unexpected} == {
        "bert.embeddings.extra.weight",
        "cls.predictions.bias",
    }
    assert r.load.unmatched_patterns == []


@pytest.mark.parametrize("pattern", ["bert.pooler.*", "model.pooler.*"])
def test_allow_missing_takes_the_checkpoint_name_or_the_model_name(bert, pattern):
    r = _inspect(bert, allow_missing=(pattern, "classifier.*"))
    assert {m.name: m.allowed for m in r.load.missing} == {
        **dict.fromkeys(POOLER, pattern),
        **dict.fromkeys(HEAD, "classifier.*"),
    }
    assert not r.load.failing_missing and r.load.unmatched_patterns == []
    assert f"(allowed by --allow-missing {pattern!r})" in r.render()


def test_allow_missing_matches_whole_names_only(bert):
    # 'pooler.*' is neither spelling's start: the tensors stay missing, and the report says so.
    r = _inspect(bert, allow_missing=("pooler.*",))
    assert len(r.load.failing_missing) == 4
    (u,) = r.load.unmatched_patterns
    assert (u.option, u.pattern) == ("--allow-missing", "pooler.*")


@pytest.mark.parametrize("prefix", ["bert.encoder.layer.1.", "model.encoder.layer.1."])
def test_skip_prefix_takes_the_checkpoint_name_or_the_model_name(bert, prefix):
    r = _inspect(bert, skip_prefixes=(prefix,))
    skipped = {name: rule for name, (status, rule) in _fates(r).items() if status == "skipped"}
    assert len(skipped) == 16 and all(n.startswith("bert.encoder.layer.1.") for n in skipped)
    spelling = " (checkpoint name)" if prefix.startswith("bert.") else ""
    assert set(skipped.values()) == {f"skip_prefixes {prefix!r}{spelling}"}
    # what a skipped key would have filled is missing now: the skip happened before the walk
    missing = {m.name for m in r.load.missing}
    assert "model.encoder.layer.1.output.dense.bias" in missing and len(missing) == 4 + 16


@pytest.mark.parametrize(
    ("rule", "pattern", "spelling"),
    [
        ("ignore_unexpected_prefixes", "bert.embeddings.extra", " (checkpoint name)"),
        ("ignore_unexpected_prefixes", "model.embeddings.extra", ""),  # the walk's own test
        ("ignore_unexpected_suffixes", "embeddings.extra.weight", " (checkpoint name)"),
    ],
)
def test_ignore_rules_take_the_checkpoint_name_or_the_model_name(bert, rule, pattern, spelling):
    r = _inspect(bert, **{rule: (pattern,)})
    assert _fates(r)["bert.embeddings.extra.weight"] == ("ignored", f"{rule} {pattern!r}{spelling}")
    assert [u.name for u in r.load.unexpected] == ["cls.predictions.bias"]
    assert r.load.unmatched_patterns == []


def test_a_suffix_the_walk_tests_where_it_found_nothing_counts_as_matched(bert):
    # vLLM tests an ignore rule on 'cls', the name where its walk finds nothing, so suffix
    # 'cls' spares 'cls.predictions.bias' though neither whole name ends with it.
    r = _inspect(bert, ignore_unexpected_suffixes=("cls",))
    assert _fates(r)["cls.predictions.bias"] == ("ignored", "ignore_unexpected_suffixes 'cls'")
    assert r.load.unmatched_patterns == []


def test_every_pattern_that_matched_nothing_is_a_warning_that_changes_no_verdict(bert):
    before = _inspect(bert)
    r = _inspect(
        bert,
        skip_prefixes=("bert.pooler.", "bert.encoder.layer.0.attention."),
        ignore_unexpected_prefixes=("lm_head.",),
        ignore_unexpected_suffixes=(".gamma",),
        allow_missing=("model.embeddings.*", "classifier.*"),
    )
    got = [(u.option, u.pattern) for u in r.load.unmatched_patterns]
    assert got == [
        ("--skip-prefix", "bert.pooler."),  # the checkpoint has no pooler
        ("--ignore-unexpected-prefix", "lm_head."),
        ("--ignore-unexpected-suffix", ".gamma"),
        ("--allow-missing", "model.embeddings.*"),  # every embedding loaded
    ]
    text = r.render().splitlines()
    warnings = [line for line in text if line.startswith("warning: ")]
    assert warnings[0] == (
        "warning: --skip-prefix 'bert.pooler.' matched no checkpoint key (by its checkpoint name "
        "or its name after the mapper): it skips nothing"
    )
    assert [w.split()[1:3] for w in warnings] == [
        ["--skip-prefix", "'bert.pooler.'"],
        ["--ignore-unexpected-prefix", "'lm_head.'"],
        ["--ignore-unexpected-suffix", "'.gamma'"],
        ["--allow-missing", "'model.embeddings.*'"],
    ]
    verdict = text.index(next(line for line in text if line.startswith("verdict")))
    assert text[verdict - 1] == warnings[-1] and text[-1].endswith("(exit 1)")
    doc = json.loads(r.to_json())
    assert [u["pattern"] for u in doc["load"]["unmatched_patterns"]] == [p for _, p in got]
    assert doc["load"]["unmatched_patterns"][0]["rule"] == "skip_prefixes"
    # Warnings only: the verdict is the one the rules that matched give alone.
    matched = _inspect(
        bert, skip_prefixes=("bert.encoder.layer.0.attention.",), allow_missing=("classifier.*",)
    )
    assert r.exit_status == matched.exit_status == 1 and matched.load.unmatched_patterns == []
    problems = ["2 unexpected", "12 model tensors never filled"]
    assert r.load.problems() == matched.load.problems() == problems
    assert _fates(r) == _fates(matched) != _fates(before)


def test_the_command_line_warns_and_keeps_its_exit_status(bert, loadkit_cli):
    allowed = ["inspect", bert, "--model", "hf", "--model-impl", "transformers", "--loader", "vllm"]
    allowed += ["--allow-missing", "model.pooler.*", "--allow-missing", "classifier.*"]
    allowed += ["--ignore-unexpected-prefix", "cls."]
    allowed += ["--ignore-unexpected-prefix", "bert.embeddings.extra"]
    clean = loadkit_cli(*allowed)
    assert clean.returncode == 0, clean.stdout[-800:]
    assert "warning" not in clean.stdout and clean.stderr == ""
    res = loadkit_cli(*allowed, "--allow-missing", "nothing.*")
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout.splitlines()[-2:] == [
        "warning: --allow-missing 'nothing.*' matched no missing model tensor (by its model name "
        "or the checkpoint name it would be loaded from): it allows nothing",
        "verdict: vllm 0.34.0, TransformersForSequenceClassification: would load cleanly (exit 0)",
    ]
    js = loadkit_cli(*allowed, "--allow-missing", "nothing.*", "--json")
    doc = json.loads(js.stdout)
    assert js.returncode == 0 and doc["exit_status"] == 0 and doc["clean"] is True
    assert doc["load"]["unmatched_patterns"] == [
        {
            "option": "--allow-missing",
            "rule": "allow_missing",
            "pattern": "nothing.*",
            "message": res.stdout.splitlines()[-2].removeprefix("warning: "),
        }
    ]


def test_the_rules_apply_to_the_transformers_loader_too(bert):
    import transformers

    real = transformers.BertForSequenceClassification.from_pretrained(
        bert, output_loading_info=True
    )[1]
    before = inspect_checkpoint(bert, model="hf", model_impl="transformers").from_pretrained
    assert sorted(before.missing) == sorted(real["missing_keys"])  # the oracle's own lists
    assert sorted(before.unexpected) == sorted(real["unexpected_keys"])
    rules = LoadRules(
        allow_missing=("bert.pooler.*", "classifier.*"),
        skip_prefixes=("bert.embeddings.extra.",),
        ignore_unexpected_prefixes=("cls.",),
    )
    r = inspect_checkpoint(bert, model="hf", model_impl="transformers", rules=rules)
    after = r.from_pretrained
    assert (after.missing, after.unexpected, after.clean) == ((), (), True)
    assert sorted(after.allowed) == sorted(real["missing_keys"])
    assert sorted(after.ignored) == sorted(real["unexpected_keys"])
    assert r.clean and r.exit_status == 0
    assert r.loaders["transformers"].clean and r.loaders["vllm"].clean
    text = r.render()
    assert "  missing, allowed by --allow-missing (still at random) (4)" in text
    assert "  unexpected, taken by the skip and ignore rules (2)" in text
    document = json.loads(r.to_json())
    assert sorted(document["transformers"]["allowed"]) == sorted(real["missing_keys"])
