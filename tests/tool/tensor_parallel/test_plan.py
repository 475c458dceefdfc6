"""``loadkit inspect --model ... --tp N``: each rank's share and what cannot work, header-only."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest
from repo_paths import DATA

from loadkit.errors import LoadkitError
from loadkit.models.llama import LlamaLikeConfig, write_checkpoint
from loadkit.terms import VLLM_VERSION
from loadkit_inspect import inspect_checkpoint
from loadkit_inspect.cli.main import main
from loadkit_inspect.tensor_parallel.rowmap import render_row_map, span_text

CK = str(DATA / "llama_like" / "model.safetensors")


def spans(report, key: str) -> list[str]:
    entry = next(e for e in report.tensor_parallel.entries if e.key == key)
    return [span_text(s) for s in entry.spans]


def test_tp4_plan_of_the_data_checkpoint():
    r = inspect_checkpoint(CK, model="llama-like", tp=4)
    tp = r.tensor_parallel
    assert tp.ok and r.exit_status == 0
    subjects = {f.subject: f.severity for f in tp.findings}
    assert subjects == {"kv replication": "note", "vocab padding": "note"}
    assert spans(r, "model.layers.1.self_attn.k_proj.weight") == ["0-7", "0-7", "8-15", "8-15"]
    assert spans(r, "model.layers.1.self_attn.q_proj.weight") == ["0-15", "16-31", "32-47", "48-63"]
    assert spans(r, "model.embed_tokens.weight") == ["0-31", "32-63", "64-95", "96-99"]
    down = next(e for e in tp.entries if e.key == "model.layers.0.mlp.down_proj.weight")
    assert down.axis == "cols" and down.size == 64
    assert spans(r, "model.norm.weight") == ["0-31"] * 4
    assert [rank.param_bytes for rank in tp.ranks] == [tp.ranks[0].param_bytes] * 4


@pytest.mark.parametrize(
    ("tp", "errors"),
    [
        (3, {"attention heads", "kv heads", "intermediate size", "vocabulary"}),
        (16, {"attention heads"}),
    ],
)
def test_what_cannot_work_is_listed_all_at_once(tp, errors):
    r = inspect_checkpoint(CK, model="llama-like", tp=tp)
    got = {f.subject for f in r.tensor_parallel.findings if f.severity == "error"}
    assert got == errors
    assert r.exit_status == 1 and r.tensor_parallel.ranks == []
    # vLLM raises at the heads (verify_with_parallel_config) and reaches nothing else: the
    # verdict says that refusal alone, once; the section lists every error
    assert r.render().splitlines()[-1] == (
        f"verdict: vllm {VLLM_VERSION}: would NOT load: tp={tp} refused: 8 attention heads are "
        "not divisible by "
        f"tp={tp} (exit 1)"
    )


def test_intermediate_size_alone(tmp_path):
    config = LlamaLikeConfig(intermediate_size=66)  # divisible by 2, not by 4
    path = write_checkpoint(tmp_path / "m.safetensors", config)
    two = inspect_checkpoint(path, model="llama-like", tp=2).tensor_parallel
    four = inspect_checkpoint(path, model="llama-like", tp=4).tensor_parallel
    assert two.ok
    assert [f.message for f in four.findings if f.severity == "error"] == [
        "intermediate size 66 is not divisible by tp=4"
    ]


def test_a_model_without_parallel_layers_gets_its_config_checked_not_its_ranks_simulated():
    GEMMA = DATA / "gemma4_like" / "model.safetensors"

    tp = inspect_checkpoint(GEMMA, model="gemma4-like", tp=2).tensor_parallel
    assert tp.ok and not tp.simulated and tp.ranks == []
    assert [f.subject for f in tp.findings] == ["kv replication"]  # 1 kv head over 2 ranks


def test_tp_needs_a_model():
    with pytest.raises(LoadkitError, match="tp needs a model"):
        inspect_checkpoint(CK, tp=2)


def test_cli_tp(capsys):
    assert main(["inspect", CK, "--model", "llama-like", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "tensor parallel  tp=2" in out and "would load cleanly on each of 2 ranks" in out
    assert main(["inspect", CK, "--model", "llama-like", "--tp", "3", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["tensor_parallel"]["ok"] is False and doc["exit_status"] == 1
    for bad, words in [(["--tp", "0"], "at least 1"), (["--tp", "x"], "invalid int")]:
        assert main(["inspect", CK, "--model", "llama-like", *bad]) == 2
        assert words in capsys.readouterr().err
    assert main(["inspect", CK, "--tp", "2"]) == 2
    assert "needs --model" in capsys.readouterr().err


@pytest.mark.slow  # a subprocess
def test_cli_tp_in_a_real_process_shows_no_traceback():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadkit_inspect",
            "inspect",
            CK,
            "--model",
            "llama-like",
            "--tp",
            "4",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0 and out.stderr == ""
    row = next(x.split() for x in out.stdout.splitlines() if "layers.0.self_attn.v_proj.w" in x)
    assert row[:3] == ["model.layers.0.self_attn.v_proj.weight", "rows", "16"]
    assert row[3:] == ["0-7", "0-7", "8-15", "8-15"]


def test_render_row_map_marks_failed_ranks():
    from loadkit.executor.results import Job
    from loadkit.models.llama import model_from_checkpoint
    from loadkit_inspect.tensor_parallel.rowmap import row_map
    from loadkit_inspect.tensor_parallel.share import dry_load_ranks

    job = Job.for_bug("kv-replication", "old")
    shares = dry_load_ranks(CK, 4, functools.partial(job.build, model_from_checkpoint))
    assert [s.error is not None for s in shares] == [False, False, True, True]
    text = render_row_map(
        row_map([s.records for s in shares]), failed={2: shares[2].error, 3: shares[3].error}
    )
    line = next(x for x in text.splitlines() if x.startswith("model.layers.0.self_attn.k_proj.w"))
    assert line.split()[-4:] == ["0-7", "8-15", "failed", "failed"]


def test_vocab_padding_note_says_rows_in_words_computed_from_the_sizes():
    """Issue 39: MiniLM at --tp 4 read "no rank was simulated", then "zero rows: rank 3 6"."""
    from loadkit.parallel.checks import size_findings

    (note,) = size_findings(4, heads=12, kv_heads=12, vocab_size=30522)
    assert note.message == (
        "vocabulary 30522 padded to 30528 (a multiple of 64): 7632 rows per rank, of which "
        "padding (zeros, nothing loaded into them): 6 on rank 3"
    )
    (note,) = size_findings(4, heads=8, kv_heads=8, vocab_size=100)
    assert note.message.endswith(
        "32 rows per rank, of which padding (zeros, nothing loaded into them): 28 on rank 3"
    )
