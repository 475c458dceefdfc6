"""Every suggested fix pasted as printed gets the verdict it promised.

In process: the inspects below (the committed checkpoints that need a fix, a transformers-written
BERT off by one layer and under a prefix, with and without a mapper given) each print a fix, and
each printed flag is pasted: ``--mapper`` (parsed from the printed text as a shell would),
``--replace-mapper`` and ``--loader`` when printed. A proven fix must load cleanly; an unproven
one must leave exactly the problems it said it would. The command line's runs in the whole suite
(``loadkit_cli``, in processes of their own) are collected by what they printed (``conftest``),
and pasted on the command line: this module runs after every other test. Run alone, it produces
a case of its own first.
"""

import json
import shlex
import shutil

import torch
from repo_paths import DATA
from safetensors.torch import load_file, save_file

from loadkit_inspect.inspector import inspect_checkpoint


def _bert_cases(root):
    """Inspects of a transformers-written BERT (the model's own mapper has rules JSON cannot
    hold, and two loaders judge it): off by one layer, and under a prefix."""
    import re

    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32,
        vocab_size=64, max_position_embeddings=32,
    )  # fmt: skip
    transformers.BertModel(config).save_pretrained(root / "clean")
    tensors = load_file(root / "clean" / "model.safetensors")
    calls = []
    for name, rename in [
        ("shifted", lambda k: re.sub(r"layer\.(\d+)\.", lambda m: f"layer.{int(m[1]) + 1}.", k)),
        ("prefixed", lambda k: "encoder_model." + k),
    ]:
        (root / name).mkdir()
        shutil.copy(root / "clean" / "config.json", root / name / "config.json")
        save_file({rename(k): v for k, v in tensors.items()}, root / name / "model.safetensors")
        calls.append({"checkpoint": root / name, "model": "hf", "model_impl": "transformers"})
    return calls


# Committed checkpoints whose inspect suggests a fix: a renamed plamo2, and a prefix the mapper
# given strips from names the model's own rules already strip (the fix extends the mapper given).
DATA_CASES = [
    {
        "checkpoint": DATA / "plamo2" / "tied-with-lm-head",
        "model": "plamo2",
        "mapper": {"orig_to_new_prefix": {"model.": ""}},
    },
    {
        "checkpoint": DATA / "plamo2" / "tied-with-lm-head",
        "model": "plamo2",
        "mapper": {"orig_to_new_prefix": {"model.": ""}},
        "replace_mapper": True,
    },
]


def _pasted(flag):
    tokens = shlex.split(flag)  # as a shell reads the printed text
    mapper = tokens[tokens.index("--mapper") + 1]
    loader = tokens[tokens.index("--loader") + 1] if "--loader" in tokens else None
    return mapper, "--replace-mapper" in tokens, loader


def test_every_suggestion_pasted_gets_the_verdict_promised(
    tmp_path, quiet_transformers, plamo2_broken
):
    checked = proven = 0
    broken = {"checkpoint": plamo2_broken, "model": "plamo2"}  # notebook 04's renamed plamo2
    for call in [broken, *DATA_CASES, *_bert_cases(tmp_path)]:
        report = inspect_checkpoint(**call)
        fix = report.fix
        where = f"{call}: {report.problems()}"
        assert fix is not None, where  # each case needs a fix
        if not fix.suggestions:  # said in words only: nothing to paste
            continue
        assert f"  {fix.flag}" in report.render().splitlines()  # the flag is printed as is
        mapper, replace, loader = _pasted(fix.flag)
        again = inspect_checkpoint(
            call["checkpoint"],
            model=call["model"],
            mapper=mapper,
            replace_mapper=replace,
            loader=loader or "all",
            model_impl=call.get("model_impl", "auto"),
        )
        where = f"{call['checkpoint']} --model {call['model']} {fix.flag}"
        if fix.proven:
            assert again.clean is True and again.exit_status == 0, (where, again.problems())
            proven += 1
        else:
            assert again.load.problems() == fix.result.problems(), where
        checked += 1
    assert checked >= 4 and proven >= 2, (checked, proven)
    print(f"{checked} suggested fixes pasted, {proven} proven")


def test_every_suggestion_the_command_line_printed_pasted_gets_the_verdict_promised(
    cli_suggestions_seen, loadkit_cli, tmp_path, quiet_transformers
):
    if not cli_suggestions_seen:  # run alone: one of its own
        _bert_cases(tmp_path)
        argv = ["inspect", str(tmp_path / "shifted"), "--model", "hf"]
        argv += ["--model-impl", "transformers"]
        printed = loadkit_cli(*argv).stdout
        assert "\n  --mapper '" in printed, printed
        cli_suggestions_seen = [(argv, None, {}, printed)]
    checked = 0
    for argv, cwd, env, stdout in cli_suggestions_seen:
        args = [a for a in argv if a != "--json"]
        if "--json" in argv:
            fix = json.loads(stdout)["suggested_fix"]
        else:  # the text printed the flag as is; the --json run says what it promised
            fix = json.loads(loadkit_cli(*args, "--json", cwd=cwd, env=env).stdout)["suggested_fix"]
            assert f"  {fix['flag']}" in stdout.splitlines()
        pasted = loadkit_cli(*args, *shlex.split(fix["flag"]), "--json", cwd=cwd, env=env)
        doc = json.loads(pasted.stdout)
        where = " ".join([*args, fix["flag"]])
        if fix["proven"]:
            assert pasted.returncode == 0 and doc["clean"] is True, (where, doc["load"]["problems"])
        else:
            assert doc["load"]["problems"] == fix["problems"], where
        checked += 1
    assert checked >= 1, "no suggestion printed by the command line was pasted"
    print(f"{checked} suggested fixes the command line printed pasted")
