"""Models build on meta without random init, and without replacing any function globally."""

import subprocess
import sys
import threading

import torch

from loadkit.loading.meta import on_meta
from loadkit_inspect.models.registry import build_builtin

INITS = [n for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]


def _globals():
    return {
        **{f"init.{n}": getattr(torch.nn.init, n) for n in INITS},
        **{f"Tensor.{n}": getattr(torch.Tensor, n) for n in ("normal_", "uniform_", "random_")},
    }


def test_no_global_is_replaced_during_or_after_a_build():
    before = _globals()
    seen = {}
    with on_meta():
        seen["during"] = _globals()
        torch.nn.Embedding(8, 4)
    assert seen["during"] == before and _globals() == before
    assert len(INITS) >= 9  # normal_, uniform_, kaiming_*, xavier_*, orthogonal_, sparse_, ...


def test_only_meta_tensors_and_only_this_thread_skip_the_fill():
    other = {}

    def elsewhere():  # another thread, during the block: its fills run as usual
        other["w"] = torch.nn.init.normal_(torch.zeros(1000))

    with on_meta():
        meta = torch.nn.Embedding(4, 4).weight
        cpu = torch.nn.init.normal_(torch.zeros(1000, device="cpu"))
        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()
    assert meta.is_meta
    assert cpu.std() > 0.5 and other["w"].std() > 0.5  # real random values


def test_a_build_on_meta_never_imports_dynamo():
    # In a fresh process: torch computes normal_ on meta in Python code that imports
    # torch._dynamo (seconds); the mode skips the fill, so nothing imports it.
    code = (
        "import sys, torch\n"
        "from loadkit.loading.meta import on_meta\n"
        "with on_meta():\n"
        "    m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4))\n"
        "    torch.nn.init.xavier_normal_(torch.empty(4, 4))\n"
        "    torch.nn.init.orthogonal_(torch.empty(4, 4))\n"
        "assert m[0].weight.is_meta\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_built_in_models_build_on_meta_through_it():
    from loadkit import open_checkpoint
    from loadkit_notebooks.stories import DATA_DIR

    tensors = open_checkpoint(DATA_DIR / "nemotron_h" / "initial.safetensors").tensors
    before = _globals()
    model = build_builtin("nemotron-h", tensors)
    assert all(p.is_meta for p in model.parameters()) and _globals() == before
