"""Every suggested fix the test suite produced, pasted as printed, gets the verdict it promised.

The suite's inspects announce each fix (the audit event ``loadkit.inspect.suggested_fix``,
collected by ``conftest``); this module runs after every other test and pastes each printed
flag: ``--mapper`` (parsed from the printed text as a shell would), ``--replace-mapper`` and
``--loader`` when printed. A proven fix must load cleanly; an unproven one must leave exactly the
problems it said it would. The command line's runs (``loadkit_cli``, in processes of their own,
which no audit hook here sees) are collected by what they printed, and pasted on the command
line. Run alone, it produces the issue's cases itself first.
"""

import contextlib
import json
import shlex
import shutil

import torch
from safetensors.torch import load_file, save_file

from loadkit_inspect.inspector import inspect_checkpoint


def _own_cases(root):
    """Suggestions of its own, so the test can fail when run alone: the layer off-by-one of a
    transformers-written BERT (the model's own mapper has rules JSON cannot hold), a prefix."""
    import re

    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32,
        vocab_size=64, max_position_embeddings=32,
    )  # fmt: skip
    transformers.BertModel(config).save_pretrained(root / "clean")
    tensors = load_file(root / "clean" / "model.safetensors")
    for name, rename in [
        ("shifted", lambda k: re.sub(r"layer\.(\d+)\.", lambda m: f"layer.{int(m[1]) + 1}.", k)),
        ("prefixed", lambda k: "encoder_model." + k),
    ]:
        (root / name).mkdir()
        shutil.copy(root / "clean" / "config.json", root / name / "config.json")
        save_file({rename(k): v for k, v in tensors.items()}, root / name / "model.safetensors")
        inspect_checkpoint(root / name, model="hf", model_impl="transformers")


def _pasted(flag):
    tokens = shlex.split(flag)  # as a shell reads the printed text
    mapper = tokens[tokens.index("--mapper") + 1]
    loader = tokens[tokens.index("--loader") + 1] if "--loader" in tokens else None
    return mapper, "--replace-mapper" in tokens, loader


def test_every_suggestion_pasted_gets_the_verdict_promised(
    suggestions_seen, tmp_path, quiet_transformers
):
    if len(suggestions_seen) < 3:  # run alone (or nearly): make the cases
        _own_cases(tmp_path)
        from conftest import SUGGESTIONS

        suggestions_seen = list(SUGGESTIONS)
    checked = 0
    for report, call, folder in suggestions_seen:
        fix = report.fix
        if not fix.suggestions:  # said in words only: nothing to paste
            continue
        assert f"  {fix.flag}" in report.render().splitlines()  # the flag is printed as is
        mapper, replace, loader = _pasted(fix.flag)
        with contextlib.chdir(folder):
            again = inspect_checkpoint(
                call["checkpoint"],
                model=call["model"],
                rules=call["rules"],
                model_args=call["model_args"],
                timeout=call["timeout"],
                mapper=mapper,
                replace_mapper=replace,
                loader=loader or call["loader"],
                model_impl=call["model_impl"],
            )
        where = f"{call['checkpoint']} --model {call['model']} {fix.flag}"
        if fix.proven:
            assert again.clean is True and again.exit_status == 0, (where, again.problems())
        else:
            assert again.load.problems() == fix.result.problems(), where
        checked += 1
    assert checked >= 2, "no suggestion was pasted"
    print(f"{checked} suggested fixes pasted")


def test_every_suggestion_the_command_line_printed_pasted_gets_the_verdict_promised(
    cli_suggestions_seen, loadkit_cli, tmp_path, quiet_transformers
):
    if not cli_suggestions_seen:  # run alone: one of its own
        _own_cases(tmp_path)
        argv = [
            "inspect",
            str(tmp_path / "shifted"),
            "--model",
            "hf",
            "--model-impl",
            "transformers",
        ]
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
