"""--tp claims only what was checked (issue 24): a model without tensor-parallel layers gets
vLLM's config checks, never "would load cleanly on each rank" for ranks it did not simulate."""

import pytest
import torch
from safetensors.torch import save_file
from torch import nn


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
    res = loadkit_cli("inspect", llama_4_heads_2_kv, "--model", "hf", "--tp", "3")
    assert res.returncode == 1, res.stderr
    out = res.stdout
    assert "no rank was simulated" in out and "on each of 3 ranks" not in out
    # vLLM 0.28.0's ModelConfig.verify_with_parallel_config, word for word
    assert (
        "Total number of attention heads (4) must be divisible by tensor parallel size (3)" in out
    )
    assert "tp=3 is not a multiple of the 2 kv heads" in out
    assert out.splitlines()[-1].startswith("verdict: would NOT load: tp=3: Total number of")


def test_tp_4_replicates_the_kv_heads_and_says_no_rank_was_simulated(llama_4_heads_2_kv):
    from loadkit.inspection.inspector import inspect_checkpoint

    r = inspect_checkpoint(llama_4_heads_2_kv, model="hf", tp=4)
    tp = r.tensor_parallel
    assert r.exit_status == 0 and not tp.simulated and tp.ranks == []
    assert [(f.severity, f.subject) for f in tp.findings] == [("note", "kv replication")]
    verdict = r.render().splitlines()[-1]
    assert "ranks" not in verdict.replace("no rank simulated", "")
    assert verdict.startswith("verdict: ") and verdict.endswith(
        "would load cleanly (tp=4: the config's head counts and vocabulary split "
        "checked; no rank simulated) (exit 0)"
    )
    assert r.as_dict()["tensor_parallel"]["simulated"] is False


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
