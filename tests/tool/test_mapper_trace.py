"""``loadkit inspect`` warns about stacked rules vLLM 0.28.0 applies inside another's output."""

from __future__ import annotations

import json
import subprocess
import sys

from repo_paths import DATA, REPO

from loadkit.models import vision_tower as vt
from loadkit_inspect import inspect_checkpoint

CHECKPOINT = DATA / "vision_tower" / "model.safetensors"
RULES = {k: list(v) for k, v in vt.QKV_RULES.items()}


def test_the_model_mapper_is_warned_about_with_both_rules_and_a_real_key():
    report = inspect_checkpoint(CHECKPOINT, model="vision-tower")
    found = report.as_dict()["mapper"]["rematches"]
    key = "vision_model.encoder.layers.0.self_attn.{}.bias"
    assert found == [
        {
            "first": p,
            "then": "v_proj",
            "example": key.format(p),
            "vllm_0_28_0": key.format("qkqkv_proj"),
        }
        for p in ("k_proj", "q_proj")
    ]
    text = report.render()
    assert (
        "warning: stacked rule 'v_proj' matches inside the output of stacked rule 'q_proj' "
        "(vLLM 0.28.0 tries every stacked rule in turn): " + key.format("q_proj")
    ) in text
    assert "try 'v_proj' before 'q_proj', or WeightsMapper(..., behaviour='new')" in text
    assert report.exit_status == 1  # and the load fails as it does upstream


def test_a_new_mapper_loads_but_is_still_warned_about_vllm():
    mapper = {"behaviour": "new", "orig_to_new_stacked": RULES}
    report = inspect_checkpoint(
        CHECKPOINT, model="vision-tower", mapper=mapper, replace_mapper=True
    )
    assert report.exit_status == 0 and report.clean
    assert len(report.mapper.rematches) == 2 and report.mapper.behaviour == "new"
    assert "this mapper maps it once (behaviour='new')" in report.render()


def test_v_first_is_not_warned_about_and_loads_under_old():
    mapper = {"orig_to_new_stacked": dict(reversed(RULES.items()))}
    report = inspect_checkpoint(
        CHECKPOINT, model="vision-tower", mapper=mapper, replace_mapper=True
    )
    assert report.mapper.rematches == [] and "warning: stacked" not in report.render()
    assert report.exit_status == 0


def test_the_command_line_warns_and_fails_without_a_traceback():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadkit_inspect",
            "inspect",
            str(CHECKPOINT),
            "--model",
            "vision-tower",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert out.returncode == 1, out.stderr
    assert (
        "warning: stacked rule 'v_proj' matches inside the output of stacked rule 'k_proj'"
        in out.stdout
    )
    assert "Traceback" not in out.stderr
    js = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadkit_inspect",
            "inspect",
            str(CHECKPOINT),
            "--model",
            "vision-tower",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert [r["first"] for r in json.loads(js.stdout)["mapper"]["rematches"]] == [
        "k_proj",
        "q_proj",
    ]


def test_a_new_mapper_as_json_keeps_its_behaviour():
    from loadkit import WeightsMapper
    from loadkit_inspect.fixes.fix import mapper_as_json

    new = WeightsMapper(orig_to_new_stacked=vt.QKV_RULES, behaviour="new")
    rules = mapper_as_json(new)
    assert rules == {"orig_to_new_stacked": RULES, "behaviour": "new"}
    assert WeightsMapper.from_json(rules) == new
    assert "behaviour" not in mapper_as_json(WeightsMapper(orig_to_new_stacked=vt.QKV_RULES))
