"""``inspect --tp`` on a model without tensor-parallel layers says what vLLM 0.34.0 says of the
config: ``ModelConfig.verify_with_parallel_config`` (vllm/config/model.py:1565), compiled from the
wheel's source and called on the head counts transformers' own configs give (with
``--enable-hc-sp`` off, its default)."""

from __future__ import annotations

import ast
import types

import pytest
import torch

from loadkit_inspect.inspector import inspect_checkpoint
from upstream.fetch import REFERENCE, ensure_sources
from upstream.harness import _compile, root_of


@pytest.fixture(scope="module")
def verify_with_parallel_config():
    # The method alone, compiled from the upstream file (its line numbers kept); the one name
    # its signature reads, ParallelConfig (imported under TYPE_CHECKING there), is a plain class.
    path = ensure_sources(REFERENCE) / "vllm" / "config" / "model.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    cls = next(s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == "ModelConfig")
    method = next(
        s
        for s in cls.body
        if isinstance(s, ast.FunctionDef) and s.name == "verify_with_parallel_config"
    )
    namespace: dict = {"ParallelConfig": object}
    exec(_compile(ast.Module(body=[method], type_ignores=[]), path, root_of(REFERENCE)), namespace)
    return namespace["verify_with_parallel_config"]


def _upstream_answer(verify, heads: int, tp: int) -> str | None:
    model_config = types.SimpleNamespace(
        model_arch_config=types.SimpleNamespace(total_num_attention_heads=heads),
        multimodal_config=None,
    )
    parallel = types.SimpleNamespace(
        enable_hc_sp=False,
        tensor_parallel_size=tp,
        enable_expert_parallel=False,
        pipeline_parallel_size=1,
        decode_context_parallel_size=1,
        world_size_across_dp=tp,
    )
    try:
        verify(model_config, parallel)
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_the_refusal_is_vllms_word_for_word(tp, tmp_path, verify_with_parallel_config):
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=64,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    upstream = _upstream_answer(verify_with_parallel_config, config.num_attention_heads, tp)
    report = inspect_checkpoint(tmp_path, model="hf", tp=tp)
    refusal = report.tensor_parallel.refusal
    if upstream is None:
        assert refusal is None
        assert not any(p.startswith(f"tp={tp} refused") for p in report.loaders["vllm"].problems)
    else:
        assert refusal is not None and upstream == refusal.message + "."
        assert report.loaders["vllm"].problems == [f"tp={tp} refused: {refusal.message}"]
        assert report.clean is False and report.exit_status == 1
    assert report.loaders["transformers"].clean is True  # transformers has no tp
