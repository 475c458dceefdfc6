"""--tp claims only what was checked (issue 24): a model without tensor-parallel layers (vLLM
0.34.0's Transformers backend as loadkit models it: --model-impl transformers) gets vLLM's config
checks, never "would load cleanly on each rank" for ranks it did not simulate. vLLM's native
classes have tensor-parallel layers: tests/tool/tensor_parallel/test_plan_native.py."""

from importlib.metadata import version

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

BACKEND = "vllm 0.34.0, TransformersForCausalLM"


@pytest.fixture(scope="module")
def llama_4_heads_2_kv(tmp_path_factory, quiet_transformers):
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=64,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("llama42")
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_tp_3_on_4_heads_is_refused_as_vllm_refuses_it(llama_4_heads_2_kv, loadkit_cli):
    res = loadkit_cli(
        "inspect", llama_4_heads_2_kv, "--model", "hf", "--tp", "3", "--model-impl", "transformers"
    )
    assert res.returncode == 1, res.stderr
    out = res.stdout
    assert "no rank was simulated" in out and "on each of 3 ranks" not in out
    # vLLM 0.28.0's ModelConfig.verify_with_parallel_config, word for word (vllm/config/model.py:
    # 1368; tests/upstream/test_tp_config_upstream.py runs it): the refusal is vLLM's, in the
    # vllm column; transformers has no tp
    refusal = (
        "tp=3 refused: Total number of attention heads (4) must be divisible by tensor parallel "
        "size (3)"
    )
    flat = " ".join(out.split())  # the columns wrap
    head = " ".join(out.split("\n\n")[0].split())
    tf = f"transformers {version('transformers')}"
    assert head == f"{tf}: would load cleanly {BACKEND}: would NOT load ({refusal})"
    verdict = " ".join(out[out.index("\nverdict:") :].split())
    said = f"{tf}: would load cleanly {BACKEND}: would NOT load ({refusal})"
    assert verdict == f"verdict: {said} (exit 1)"
    # each message once: the section lists every error, the verdict only what vLLM raises
    assert flat.count("Total number of attention heads (4)") == 3  # headline, section, verdict
    assert flat.count("tp=3 is not a multiple of the 2 kv heads") == 1


def test_the_json_verdict_is_the_exit_status_and_the_refusal_is_vllms(llama_4_heads_2_kv):
    from loadkit_inspect.inspector import inspect_checkpoint

    doc = inspect_checkpoint(llama_4_heads_2_kv, model="hf", tp=3, model_impl="transformers")
    doc = doc.as_dict()
    assert doc["clean"] is False and doc["exit_status"] == 1
    assert doc["load"]["clean"] is True  # the dry load alone: every key placed
    assert doc["loaders"]["transformers"] == {
        "loader": "transformers",
        "version": version("transformers"),
        "clean": True,
        "outcome": "loads",
        "problems": [],
    }
    assert doc["loaders"]["vllm"]["clean"] is False
    assert doc["loaders"]["vllm"]["problems"] == [
        "tp=3 refused: Total number of attention heads (4) must be divisible by tensor parallel "
        "size (3)"
    ]
    only_transformers = inspect_checkpoint(
        llama_4_heads_2_kv, model="hf", tp=3, loader="transformers"
    )
    assert only_transformers.clean is True and only_transformers.exit_status == 0


@pytest.mark.parametrize("arch", ["bert", "gpt2", "t5"])
def test_without_grouped_query_attention_the_heads_are_refused_once(
    arch, tmp_path, quiet_transformers
):
    import transformers

    torch.manual_seed(0)
    small = {"vocab_size": 64}
    config, cls = {
        "bert": (
            transformers.BertConfig(
                hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                **small,
            ),
            transformers.BertModel,
        ),
        "gpt2": (
            transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, n_positions=32, **small),
            transformers.GPT2LMHeadModel,
        ),
        "t5": (
            transformers.T5Config(
                d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4, **small
            ),
            transformers.T5ForConditionalGeneration,
        ),
    }[arch]  # fmt: skip
    cls(config).save_pretrained(tmp_path)
    from loadkit_inspect.inspector import inspect_checkpoint

    r = inspect_checkpoint(tmp_path, model="hf", tp=3, model_impl="transformers")
    errors = [(f.subject, f.message) for f in r.tensor_parallel.findings if f.severity == "error"]
    assert errors[0] == (
        "attention heads",
        "Total number of attention heads (4) must be divisible by tensor parallel size (3)",
    )
    assert "kv heads" not in [subject for subject, _ in errors]  # the same heads, said once
    assert r.exit_status == 1 and r.clean is False
    refusals = [p for p in r.loaders["vllm"].problems if p.startswith("tp=3")]
    assert refusals == [
        "tp=3 refused: Total number of attention heads (4) must be divisible by tensor parallel "
        "size (3)"
    ]
    assert r.loaders["transformers"].problems == []


def test_tp_4_replicates_the_kv_heads_and_says_no_rank_was_simulated(llama_4_heads_2_kv):
    from loadkit_inspect.inspector import inspect_checkpoint

    r = inspect_checkpoint(llama_4_heads_2_kv, model="hf", tp=4, model_impl="transformers")
    tp = r.tensor_parallel
    assert r.exit_status == 0 and not tp.simulated and tp.ranks == []
    assert [(f.severity, f.subject) for f in tp.findings] == [("note", "kv replication")]
    text = r.render()
    verdict = " ".join(text[text.index("\nverdict:") :].split())  # the columns wrap
    assert "ranks" not in verdict.replace("no rank simulated", "")
    assert verdict.startswith("verdict: ") and verdict.endswith(
        "would load cleanly (tp=4: the config's head counts and vocabulary split "
        "checked; no rank simulated) (exit 0)"
    )
    assert r.as_dict()["tensor_parallel"]["simulated"] is False
    assert (
        r.as_dict()["tensor_parallel"]["not_simulated"] == "the model has no tensor-parallel layers"
    )


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)


def test_a_model_with_nothing_to_check_for_tp_is_refused_with_exit_2(tmp_path, loadkit_cli):
    f = tmp_path / "m.safetensors"
    save_file({k: v.contiguous() for k, v in Plain().state_dict().items()}, str(f))
    (tmp_path / "plainmod.py").write_text(
        "from torch import nn\n"
        "class Plain(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.a = nn.Linear(2, 2)\n"
    )
    res = loadkit_cli("inspect", f, "--model", f"{tmp_path / 'plainmod.py'}:Plain", "--tp", "2")
    assert res.returncode == 2 and res.stdout == ""
    assert (
        "Plain has no tensor-parallel layers and no config with num_attention_heads" in res.stderr
    )
    assert len(res.stderr.splitlines()) == 1
