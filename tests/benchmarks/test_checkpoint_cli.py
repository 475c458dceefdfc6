"""``benchmarks/checkpoint_cli.py``, the command line both benchmark checkpoint writers share,
through the Llama-like writer (``tests/library/models/gemma4/test_checkpoint.py`` runs the
Gemma4-like one)."""

from __future__ import annotations

import pytest

from loadkit import open_checkpoint
from loadkit.models import llama


def test_llama_cli_writes_the_preset_it_names(tmp_path, capsys, llama_bench):
    out = tmp_path / "big" / "l.safetensors"
    assert llama_bench.main([str(out), "--preset", "tiny", "--seed", "3"]) == 0
    tiny = llama_bench.PRESETS["tiny"]
    n = len(llama.checkpoint_layout(tiny))
    assert capsys.readouterr().out.startswith(f"{n} tensors, 0.000 GiB -> {out}")
    ck = open_checkpoint(out)
    assert llama.config_from_checkpoint(ck.tensors) == tiny
    ref = llama.write_checkpoint(tmp_path / "ref.safetensors", tiny, seed=3)
    assert out.read_bytes() == ref.read_bytes()  # the seed reaches the writer


def test_llama_cli_refuses_an_unknown_preset(tmp_path, capsys, llama_bench):
    with pytest.raises(SystemExit) as exc:
        llama_bench.main([str(tmp_path / "x.safetensors"), "--preset", "huge"])
    assert exc.value.code == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err
    assert not (tmp_path / "x.safetensors").exists()
