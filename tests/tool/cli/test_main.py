"""`loadkit inspect` as a user runs it: real processes, real files, exit statuses."""

import json
import struct
import subprocess
import sys
import textwrap

import pytest
from repo_paths import REPO

from loadkit.terms import VLLM_VERSION
from loadkit_inspect.cli.arguments import parse_inspect
from loadkit_inspect.cli.main import main
from loadkit_inspect.models.registry import BUILTIN

DTYPE_SIZE = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8}


def write_safetensors(path, tensors, *, pad=True):
    """A safetensors file written byte by byte (header length, JSON header, zero data)."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = DTYPE_SIZE[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    if pad:
        blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))
    return path


# A Qwen2-7B-style layout (as published on the Hub: q/k/v with biases, untied lm_head), small
# sizes, two layers.
H, I, V, KV = 16, 32, 64, 8  # noqa: E741 (upstream's config names)


def qwen2_layout(layers=2):
    t = {"model.embed_tokens.weight": ("BF16", (V, H))}
    for i in range(layers):
        p = f"model.layers.{i}"
        t |= {
            f"{p}.input_layernorm.weight": ("BF16", (H,)),
            f"{p}.mlp.down_proj.weight": ("BF16", (H, I)),
            f"{p}.mlp.gate_proj.weight": ("BF16", (I, H)),
            f"{p}.mlp.up_proj.weight": ("BF16", (I, H)),
            f"{p}.post_attention_layernorm.weight": ("BF16", (H,)),
            f"{p}.self_attn.k_proj.bias": ("BF16", (KV,)),
            f"{p}.self_attn.k_proj.weight": ("BF16", (KV, H)),
            f"{p}.self_attn.o_proj.weight": ("BF16", (H, H)),
            f"{p}.self_attn.q_proj.bias": ("BF16", (H,)),
            f"{p}.self_attn.q_proj.weight": ("BF16", (H, H)),
            f"{p}.self_attn.v_proj.bias": ("BF16", (KV,)),
            f"{p}.self_attn.v_proj.weight": ("BF16", (KV, H)),
        }
    t |= {"model.norm.weight": ("BF16", (H,)), "lm_head.weight": ("BF16", (V, H))}
    return t


# What a user writes: their own model, in their own file, with upstream's parameter names.
USER_MODEL = textwrap.dedent(
    f"""
    import torch
    from torch import nn

    H, I, V, KV = {H}, {I}, {V}, {KV}

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(H, H)
            self.k_proj = nn.Linear(H, KV)
            self.v_proj = nn.Linear(H, KV)
            self.o_proj = nn.Linear(H, H, bias=False)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(H, I, bias=False)
            self.up_proj = nn.Linear(H, I, bias=False)
            self.down_proj = nn.Linear(I, H, bias=False)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attention()
            self.mlp = MLP()
            self.input_layernorm = nn.RMSNorm(H)
            self.post_attention_layernorm = nn.RMSNorm(H)

    class Qwen2Model(nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, H)
            self.layers = nn.ModuleList([Layer() for _ in range(layers)])
            self.norm = nn.RMSNorm(H)

    class Qwen2ForCausalLM(nn.Module):
        def __init__(self, layers=2):
            super().__init__()
            self.model = Qwen2Model(layers)
            self.lm_head = nn.Linear(H, V, bias=False)

    def build():
        return Qwen2ForCausalLM().to(torch.bfloat16)

    def build_sized(tensors):
        layers = 1 + max(int(n.split(".")[2]) for n in tensors if n.startswith("model.layers."))
        return Qwen2ForCausalLM(layers).to(torch.bfloat16)
    """
)


@pytest.fixture
def qwen(tmp_path):
    (tmp_path / "my_qwen.py").write_text(USER_MODEL)
    return tmp_path


def test_a_real_upstream_layout_with_a_renamed_and_a_missing_key(
    qwen, monkeypatch, capsys, loadkit_cli
):
    layout = qwen2_layout()
    good = write_safetensors(qwen / "good.safetensors", layout)
    res = loadkit_cli("inspect", good, "--model", "my_qwen:build", cwd=qwen)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"verdict: vllm {VLLM_VERSION}: would load cleanly (exit 0)" in res.stdout
    assert "checkpoint 27 keys: 27 loaded" in res.stdout

    layout["model.layers.1.mlp.gate.weight"] = layout.pop("model.layers.1.mlp.gate_proj.weight")
    del layout["model.layers.0.self_attn.k_proj.bias"]
    bad = write_safetensors(qwen / "bad.safetensors", layout)
    res = loadkit_cli("inspect", bad, "--model", "my_qwen:build", "--json", cwd=qwen)
    assert res.returncode == 1, res.stderr
    load = json.loads(res.stdout)["load"]
    (unexpected,) = load["unexpected"]
    assert unexpected["name"] == "model.layers.1.mlp.gate.weight"
    assert unexpected["suggestions"][0] == "model.layers.1.mlp.gate_proj.weight"
    missing = {m["name"]: m for m in load["missing"]}
    assert set(missing) == {
        "model.layers.0.self_attn.k_proj.bias",
        "model.layers.1.mlp.gate_proj.weight",
    }
    assert missing["model.layers.1.mlp.gate_proj.weight"]["suggestions"] == [
        "model.layers.1.mlp.gate.weight"
    ]
    assert missing["model.layers.0.self_attn.k_proj.bias"]["shape"] == [KV]

    # The same, in process (spares a torch import), as text.
    monkeypatch.syspath_prepend(str(qwen))
    assert main(["inspect", str(bad), "--model", "my_qwen:build"]) == 1
    text = capsys.readouterr().out
    assert "unexpected names (1)" in text and "missing: model tensors never filled (2)" in text
    assert "nearest: model.layers.1.mlp.gate_proj.weight" in text
    assert "layers.{0-1}" in text  # the key tree folds the layers


def test_model_from_a_file_and_sized_from_the_checkpoint(qwen, monkeypatch, capsys, loadkit_cli):
    f = write_safetensors(qwen / "four.safetensors", qwen2_layout(layers=4))
    res = loadkit_cli("inspect", f, "--model", f"{qwen / 'my_qwen.py'}:build_sized")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Qwen2ForCausalLM, 51 tensors" in res.stdout  # 4 layers x 12 + 3, sized from names
    monkeypatch.syspath_prepend(str(qwen))
    assert main(["inspect", str(f), "--model", "my_qwen:build", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert len(report["load"]["unexpected"]) == 24  # layers 2 and 3 do not exist in a 2-layer model
    assert report["load"]["runs"] <= 3  # each unknown layer is left out whole, in one pass


def test_header_only_report_and_json(tmp_path, loadkit_cli):
    f = write_safetensors(tmp_path / "m.safetensors", qwen2_layout())
    res = loadkit_cli("inspect", f)
    assert res.returncode == 0 and res.stderr == ""
    out = res.stdout
    assert out.startswith(f"checkpoint  {f}\n  1 file, 27 tensors")
    assert "dtypes  BF16 27 tensors" in out
    assert "layers.{0-1}" in out and " 2 layers x 12 tensors " in out
    assert "verdict: headers valid" in out
    doc = json.loads(loadkit_cli("inspect", f, "--json").stdout)
    assert doc["schema"] == 8 and doc["exit_status"] == 0 and doc["clean"] is None
    assert doc["loaders"] is None and doc["transformers"] is None
    assert doc["checkpoint"]["tensor_count"] == 27
    assert doc["checkpoint"]["tensors"][0]["name"] == "model.embed_tokens.weight"
    assert [c["name"] for c in doc["layout"]["children"]] == ["model", "lm_head"]


def test_sharded_folder_with_index(tmp_path, loadkit_cli):
    layout = list(qwen2_layout().items())
    folder = tmp_path / "sharded"
    folder.mkdir()
    weight_map = {}
    for i, part in enumerate((layout[:10], layout[10:])):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        write_safetensors(folder / name, dict(part))
        weight_map |= dict.fromkeys((k for k, _ in part), name)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    res = loadkit_cli("inspect", folder)
    assert res.returncode == 0
    assert "2 files, 27 tensors" in res.stdout
    assert "model-00001-of-00002.safetensors      10 tensors" in res.stdout


def test_shard_list_is_capped_by_limit_and_counts_in_the_singular(tmp_path, loadkit_cli):
    # DeepSeek-V3 ships 163 shards: the shard list obeys --limit like every other list.
    folder = tmp_path / "many"
    folder.mkdir()
    names = [f"model-{i + 1:05d}-of-00025.safetensors" for i in range(25)]
    for i, name in enumerate(names):
        write_safetensors(folder / name, {f"layers.{i}.w": ("F32", (2,))})
    weight_map = {f"layers.{i}.w": name for i, name in enumerate(names)}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    res = loadkit_cli("inspect", folder, "--limit", "3")
    assert res.returncode == 0, res.stderr
    shards = res.stdout.split("  files\n")[1].split("\n\n")[0].splitlines()
    assert shards == [
        f"    {names[0]}       1 tensor         8 B",
        f"    {names[1]}       1 tensor         8 B",
        f"    {names[2]}       1 tensor         8 B",
        "    ... 22 more (--json lists them all)",
        "  read by transformers and vllm: all 25 files (the files the index names)",
    ]
    document = json.loads(loadkit_cli("inspect", folder, "--limit", "3", "--json").stdout)
    assert len(document["checkpoint"]["files"]) == 25


def test_mapper_rules_on_the_command_line(tmp_path, loadkit_cli):
    f = write_safetensors(tmp_path / "m.safetensors", qwen2_layout())
    rules = {"orig_to_new_prefix": {"model.": ""}, "orig_to_new_substr": {".bias": None}}
    res = loadkit_cli("inspect", f, "--mapper", json.dumps(rules))
    assert res.returncode == 0
    assert "mapper  (--mapper): 20 keys renamed, 6 dropped, 1 unchanged" in res.stdout
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(rules))
    doc = json.loads(loadkit_cli("inspect", f, "--mapper", path, "--json").stdout)
    assert doc["mapper"]["source"] == "--mapper"
    assert len(doc["mapper"]["dropped"]) == 6


def test_exit_2_for_unusable_input(tmp_path, loadkit_cli):
    good = write_safetensors(tmp_path / "good.safetensors", {"w": ("F32", (2, 2))})
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-4])
    not_json = tmp_path / "notjson.safetensors"
    not_json.write_bytes(struct.pack("<Q", 8) + b"{nope!!}")
    bad_dtype = tmp_path / "dtype.safetensors"
    blob = json.dumps({"w": {"dtype": "F128", "shape": [2], "data_offsets": [0, 32]}}).encode()
    bad_dtype.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(32))
    bad_shape = tmp_path / "shape.safetensors"
    blob = json.dumps({"w": {"dtype": "F32", "shape": [3, 3], "data_offsets": [0, 16]}}).encode()
    bad_shape.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(16))
    twice = tmp_path / "twice"
    twice.mkdir()
    write_safetensors(twice / "a.safetensors", {"w": ("F32", (2,))})
    write_safetensors(twice / "b.safetensors", {"w": ("F32", (3,))})
    index = tmp_path / "index"
    index.mkdir()
    write_safetensors(index / "a.safetensors", {"w": ("F32", (2,))})
    (index / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "a.safetensors", "v": "gone.safetensors"}})
    )
    cases = [
        (tmp_path / "nothing.safetensors", ["no such file"]),
        (truncated, ["truncated.safetensors", "'w'", "[2, 2]"]),
        (not_json, ["notjson.safetensors", "not valid JSON"]),
        (bad_dtype, ["dtype.safetensors", "'w'", "F128"]),
        (bad_shape, ["shape.safetensors", "'w'", "[3, 3]", "16"]),
    ]
    for path, words in cases:
        res = loadkit_cli("inspect", path)
        assert res.returncode == 2, (path, res.stdout, res.stderr)
        assert res.stdout == ""
        assert res.stderr.startswith("loadkit inspect: error: "), res.stderr
        assert "Traceback" not in res.stderr
        for w in words:
            assert w in res.stderr, (w, res.stderr)
    res = loadkit_cli("inspect", truncated, "--json")
    assert res.returncode == 2 and json.loads(res.stdout)["exit_status"] == 2
    # A folder whose shards disagree (with each other, or with the index) is still read: every
    # problem is listed with where the key is, and the rest of the report printed (exit 1).
    for path, words in [
        (twice, ["in two shards", "a.safetensors and b.safetensors", "'w'", "[2]", "[3]"]),
        (index, ["missing shard", "gone.safetensors", "'v'", "no shard holds it"]),
    ]:
        res = loadkit_cli("inspect", path)
        assert res.returncode == 1, (path, res.stdout, res.stderr)
        assert res.stderr == "" and "layout" in res.stdout
        for w in words:
            assert w in res.stdout, (path, w, res.stdout)


def test_exit_2_for_bad_model_mapper_and_arguments(qwen, monkeypatch, capsys, loadkit_cli):
    f = write_safetensors(qwen / "m.safetensors", qwen2_layout())
    res = loadkit_cli("inspect", f, "--model", "my_qwen:missing", cwd=qwen)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert (
        res.stderr
        == "loadkit inspect: error: --model 'my_qwen:missing': my_qwen has no attribute 'missing'\n"
    )
    monkeypatch.chdir(qwen)
    monkeypatch.syspath_prepend(str(qwen))
    cases = [
        (["--model", "nope"], "not a built-in model"),
        (["--model", "nowhere_module:build"], "no module named 'nowhere_module'"),
        (["--model", "my_qwen:missing"], "has no attribute 'missing'"),
        (["--mapper", "{broken"], "not valid JSON"),
        (["--mapper", '{"orig_to_new_suffix": {"": "x"}}'], "empty suffix"),
        (["--mapper", '{"orig_to_new_regex": {"(": "x"}}'], "invalid regex"),
        (["--mapper", '{"orig_to_new_prefixes": {}}'], "unknown field"),
    ]
    for extra, words in cases:
        assert main(["inspect", str(f), *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("loadkit inspect: error: ") and words in err, (words, err)
    for argv, words, usage in [
        ([], "required: COMMAND", "loadkit: error: "),
        (["frobnicate"], "invalid choice: 'frobnicate'", "loadkit: error: "),
        (["inspect"], "required: CHECKPOINT", "loadkit inspect: error: "),
        (["inspect", f, "--model"], "expected one argument", "loadkit inspect: error: "),
        (
            ["inspect", f, "--bogus"],
            "unrecognized arguments: --bogus",
            "loadkit inspect: error: ",
        ),
        (
            ["inspect", f, "extra"],
            "unrecognized arguments: extra",
            "loadkit inspect: error: ",
        ),
        (
            ["inspect", f, "--tp", "2"],
            "argument --tp: needs --model",
            "loadkit inspect: error: ",
        ),
        (["inspect", f, "--limit", "x"], "invalid int value", "loadkit inspect: error: "),
        (
            ["inspect", f, "--allow-missing", "["],
            "argument --allow-missing: invalid pattern '[': '[' at 0 opens a character class "
            "never closed",
            "loadkit inspect: error: ",
        ),
    ]:
        assert main([str(a) for a in argv]) == 2, argv
        err = capsys.readouterr().err
        assert words in err and err.startswith(usage), (argv, err)
        assert len(err.splitlines()) == 2, err
        # the help of the command whose usage was wrong
        command = usage.split(": error: ")[0]
        assert err.splitlines()[1] == f"see: {command} --help", err
    res = loadkit_cli("inspect")  # and once as a process
    assert res.returncode == 2 and "required: CHECKPOINT" in res.stderr
    bad = ["--model", "my_qwen:build", "--allow-missing", "layers.[0-3.*"]
    res = loadkit_cli("inspect", f, *bad, cwd=qwen)
    assert res.returncode == 2 and res.stdout == "" and "Traceback" not in res.stderr
    assert "invalid pattern 'layers.[0-3.*': '[' at 7 opens" in res.stderr


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("classifier.*", None),
        ("layers.[0-3].*", None),
        ("[[]x", None),  # a literal '['
        ("[]]", None),  # a class holding ']'
        ("[!]]", None),
        ("[", 0),
        ("[]", 0),  # ']' first is a member: the class never closes
        ("[!]", 0),
        ("a.[0-3.*", 2),
        ("[a][", 3),
    ],
)
def test_allow_missing_patterns_fnmatch_would_take_literally_are_refused(pattern, problem):
    from loadkit_inspect.options import pattern_problem

    found = pattern_problem(pattern)
    assert found is None if problem is None else found.startswith(f"'[' at {problem} opens")
    if problem is None:
        assert parse_inspect(["ck", "--allow-missing", pattern]).allow_missing == (pattern,)


def test_help(capsys):
    assert main(["--help"]) == 0
    assert "inspect" in capsys.readouterr().out
    assert main(["inspect", "--help"]) == 0
    out = capsys.readouterr().out
    for word in (
        "--model",
        "--mapper",
        "--json",
        "--debug",
        "exit status",
        "package.module:callable",
    ):
        assert word in out


def test_argument_forms():
    a = parse_inspect(["ck", "--model=x:y", "--mapper", "{}", "--json", "--limit", "3"])
    assert (a.checkpoint, a.model, a.mapper, a.json, a.limit) == ("ck", "x:y", "{}", True, 3)
    assert parse_inspect(["--", "-odd-name"]).checkpoint == "-odd-name"
    assert parse_inspect(["ck", "--model", "a", "--model", "b"]).model == "b"


def test_help_says_which_models_get_the_pooling_probe(capsys):
    assert main(["inspect", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # not every model: only a pooling one, or any with --probe (test_rules_and_model_args_...)
    assert "which mapper rule fired for which key, unexpected" in out
    assert (
        "for a pooling model (one with is_pooling_model, as loadkit.as_pooling_model makes; the "
        "built-in and hf models are not) or with --probe, the pooling probe's verdict" in out
    )
    assert "a pooling model always gets them" not in out


def test_help_files_probe_among_the_options_not_the_rules(capsys):
    assert main(["inspect", "--help"]) == 0
    out = capsys.readouterr().out
    options, rest = out.split("\noptions:\n")[1].split("\nrules:\n")
    rules = rest.split("\nexit status:")[0]
    assert "--probe" in options and "--probe" not in rules
    assert "--skip-prefix" in rules and "--strict-dtype" in rules


def test_help_lists_the_registry(capsys):
    assert main(["inspect", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in BUILTIN), out


TORCH_PROBE = textwrap.dedent(
    """
    import runpy, sys
    sys.argv = ["loadkit", *sys.argv[1:]]
    try:
        runpy.run_module("loadkit_inspect", run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        code = exit.code
    print("TORCH_IMPORTED" if "torch" in sys.modules else "TORCH_NOT_IMPORTED", file=sys.stderr)
    raise SystemExit(code)
    """
)


def test_header_only_path_never_imports_torch(tmp_path):
    f = write_safetensors(tmp_path / "m.safetensors", qwen2_layout())
    rules = json.dumps({"orig_to_new_prefix": {"model.": ""}})
    for extra in ([], ["--json"], ["--mapper", rules]):
        res = subprocess.run(
            [sys.executable, "-c", TORCH_PROBE, "inspect", str(f), *extra],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        assert res.stderr.strip() == "TORCH_NOT_IMPORTED", (extra, res.stderr)
    # The probe itself can see torch: with a model it is imported.
    (tmp_path / "m1.py").write_text(
        "from torch import nn\ndef build():\n    return nn.Linear(2, 2)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", TORCH_PROBE, "inspect", str(f), "--model", "m1:build"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert res.returncode == 1 and res.stderr.strip().endswith("TORCH_IMPORTED"), res.stderr


def test_importtime_agrees(tmp_path):
    f = write_safetensors(tmp_path / "m.safetensors", {"w": ("F32", (2,))})
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "loadkit_inspect", "inspect", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0
    imported = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines()}
    assert "loadkit_inspect.inspector" in imported and "torch" not in imported


CLASSIFIER_MODEL = """
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.dense = nn.Linear(4, 4)


class Classifier(nn.Module):
    def __init__(self, num_labels=2):
        super().__init__()
        self.bert = Encoder()
        self.classifier = nn.Linear(4, num_labels)


def build(num_labels=2):
    return Classifier(num_labels)
"""


def test_flags_for_a_fresh_classification_head(tmp_path, loadkit_cli):
    (tmp_path / "cls_model.py").write_text(CLASSIFIER_MODEL)
    f = write_safetensors(
        tmp_path / "m.safetensors",
        {
            "bert.embed.weight": ("F32", (8, 4)),
            "bert.dense.weight": ("F32", (4, 4)),
            "bert.dense.bias": ("F32", (4,)),
            "bert.embed.position_ids": ("I64", (1, 8)),
            "cls.head.weight": ("F32", (4, 4)),
            "cls.head.decoder": ("F32", (8, 4)),
            "bert.dense.scale": ("F32", (1,)),
        },
    )
    base = ["inspect", f, "--model", "cls_model.py:build", "--model-arg", "num_labels=3"]
    res = loadkit_cli(*base, cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert "classifier.weight  [3, 4] float32" in res.stdout  # the argument reached the model
    flags = [
        "--skip-prefix", "bert.embed.position_ids",
        "--ignore-unexpected-prefix", "cls.",
        "--ignore-unexpected-suffix", ".scale",
        "--allow-missing", "classifier.*",
    ]  # fmt: skip
    res = loadkit_cli(*base, *flags, cwd=tmp_path)
    assert res.returncode == 0, res.stdout
    assert "2 missing (2 allowed by --allow-missing)" in res.stdout
    assert "2 ignored: ignore_unexpected_prefixes 'cls.'" in res.stdout
    assert "1 ignored: ignore_unexpected_suffixes '.scale'" in res.stdout
    doc = json.loads(loadkit_cli(*base, *flags, "--json", cwd=tmp_path).stdout)
    assert doc["load"]["rules"]["skip_prefixes"] == ["bert.embed.position_ids"]
    assert doc["exit_status"] == 0 and doc["probe"] is None
    # Without the suffix rule and --allow-missing: the leaf 'scale' and the head are reported.
    res = loadkit_cli(*base, *flags[:4], cwd=tmp_path)
    assert res.returncode == 1 and "1 unexpected" in res.stdout and "2 model tensor" in res.stdout
    assert "--probe" not in res.stdout and "pooling probe" not in res.stdout
    assert "pooling probe" in loadkit_cli(*base, "--probe", cwd=tmp_path).stdout


def test_strict_dtype_and_bad_model_args(tmp_path, loadkit_cli):
    (tmp_path / "cls_model.py").write_text(CLASSIFIER_MODEL)
    f = write_safetensors(
        tmp_path / "m.safetensors",
        {
            "bert.embed.weight": ("BF16", (8, 4)),
            "bert.dense.weight": ("BF16", (4, 4)),
            "bert.dense.bias": ("BF16", (4,)),
            "classifier.weight": ("BF16", (2, 4)),
            "classifier.bias": ("BF16", (2,)),
        },
    )
    base = ["inspect", f, "--model", "cls_model.py:build"]
    res = loadkit_cli(*base, cwd=tmp_path)
    assert res.returncode == 0 and "5 tensors bfloat16 -> float32" in res.stdout
    assert res.stdout.count("bfloat16 -> float32") == 1  # one line for the whole kind
    res = loadkit_cli(*base, "--strict-dtype", cwd=tmp_path)
    assert res.returncode == 1 and "5 dtype casts (--strict-dtype)" in res.stdout
    for bad, words in [
        (["--model-arg", "labels"], "expected KEY=VALUE"),
        (["--model-arg", "width=3"], "takes no argument 'width'"),
    ]:
        res = loadkit_cli(*base, *bad, cwd=tmp_path)
        assert res.returncode == 2 and words in res.stderr, res.stderr
    res = loadkit_cli("inspect", f, "--strict-dtype")
    assert res.returncode == 2 and "need a --model" in res.stderr


def test_parse_inspect_collects_repeated_flags():
    args = parse_inspect(
        ["ck", "--allow-missing", "a.*", "--allow-missing=b.*", "--model-arg", "n=2",
         "--model-arg", "name=x", "--strict-dtype", "--probe"]
    )  # fmt: skip
    assert args.allow_missing == ("a.*", "b.*")
    assert args.model_args == (("n", 2), ("name", "x"))
    assert args.strict_dtype and args.probe and not args.json


def test_one_renamed_key_is_1_key_renamed(tmp_path, loadkit_cli):
    f = write_safetensors(tmp_path / "m.safetensors", {"a.w": ("F32", (2,)), "b.w": ("F32", (2,))})
    res = loadkit_cli("inspect", f, "--mapper", json.dumps({"orig_to_new_prefix": {"a.": "c."}}))
    assert res.returncode == 0, res.stderr
    assert "mapper  (--mapper): 1 key renamed, 0 dropped, 1 unchanged" in res.stdout
    assert "fired for 1 key\n" in res.stdout


def test_help_and_docs_agree_that_an_inconsistent_index_exits_0(capsys):
    assert main(["inspect", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    status = "0" + out.split("exit status: 0")[1].split(" examples:")[0]
    assert (
        "0 would load cleanly (no --model: headers valid; an inconsistent index is listed, "
        "not failed, unless --strict-index)" in status
    )
    assert "1 would not load (or a tensor the index names cannot be read)" in status
    assert "disagrees" not in status
    docs = " ".join((REPO / "docs" / "inspect.md").read_text().split())
    exit_docs = docs.split("## Exit status ")[1].split(" ## ")[0]
    assert "an inconsistent index is listed, not failed, unless `--strict-index`" in exit_docs
    assert "`1` it would not (or a tensor the index names cannot be read)" in exit_docs


def test_the_command_raises_the_collector_thresholds_while_it_runs_and_restores_them(
    tmp_path, capsys
):
    """The cyclic collector runs rarer during the command (its records are long-lived), as the
    model callable sees from inside; afterwards the process has its own thresholds back."""
    import gc

    from loadkit_inspect.cli.main import GC_THRESHOLDS

    seen = tmp_path / "seen.json"
    (tmp_path / "seen_gc.py").write_text(
        textwrap.dedent(f"""
        import gc, json
        import torch
        def build():
            with open({str(seen)!r}, "w") as f:
                json.dump(gc.get_threshold(), f)
            return torch.nn.Linear(2, 2, bias=False)
        """)
    )
    before = gc.get_threshold()
    assert before != GC_THRESHOLDS
    f = REPO / "data" / "plamo2" / "untied.safetensors"
    assert main(["inspect", str(f), "--model", f"{tmp_path / 'seen_gc.py'}:build"]) == 1
    assert "unexpected names" in capsys.readouterr().out
    assert tuple(json.loads(seen.read_text())) == GC_THRESHOLDS
    assert gc.get_threshold() == before
