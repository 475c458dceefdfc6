"""loadkit inspect at the scale of the largest public checkpoints: a DeepSeek-V3-sized layout.

    python benchmarks/large_layout.py               # 163 shards, header-only and --model hf
    python benchmarks/large_layout.py --runs 5 --skip-model
    python benchmarks/large_layout.py --hf-causal   # also the forced dense wrapper

The layout follows DeepSeek-V3's published checkpoint: 61 decoder layers (3 dense, 58 with 256
routed experts and one shared expert), MLA attention (``q_a_proj``, ``q_a_layernorm``,
``q_b_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``), the
multi-token-prediction layer 61, FP8 (``F8_E4M3``) linear weights each with its
``weight_scale_inv`` (F32, one per 128x128 block), split over 163 shards with an index. The shards
are sparse files under ``data/big/large_layout/`` (ignored by git): headers written, tensor bytes
holes, so about 690 GB on paper take a few MB of disk.

Measured side by side in one run, alternating, median of ``--runs``:

1. header-only: the whole ``loadkit inspect FOLDER`` process against a process that opens
   every shard with ``safetensors.safe_open`` (framework ``numpy``, so neither side imports torch)
   and reads every key and shape. Target: ratio at most 1.0 (``ratio``: of CPU times, user +
   system; ``wall_ratio`` beside it).
2. ``--model hf`` against the header-only inspect of the same folder, target: at most 10 times.
   On the published layout its ``config.json`` carries DeepSeek-V3's ``quantization_config``
   (FP8, 128x128 blocks): vLLM 0.34.0 would build ``DeepseekV3ForCausalLM`` quantized, which
   loadkit does not model, so the vllm column is not checked and transformers' quantizer is not
   simulated; the process reads the config, builds a stand-in on meta and reports. So the same
   comparison runs on the layout as an unquantized (BF16) export would ship it (no scales, no
   ``quantization_config``, 46,183 tensors): there ``--model hf`` simulates both loads, vLLM's
   native ``DeepseekV3ForCausalLM`` over every name and ``from_pretrained`` (transformers' own
   loading code), and ``--loader vllm`` the first alone.
3. with ``--hf-causal``: ``--model hf-causal`` (the Transformers backend's dense wrapper, forced)
   on the unquantized config, at the full layout and at a quarter of the layers, to see whether
   the build and the dry load grow linearly in the names (target: seconds per name about equal
   at both sizes).

A JSON line per measurement; the last line sums them up.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

from inspect_speed import timed, write_sparse_safetensors

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "big" / "large_layout"
SHARDS = 163
BLOCK = 128  # DeepSeek-V3's FP8 scales: one float32 per 128x128 block of weights

# The published checkpoint's FP8 weights, each with its 128x128 block scales.
QUANTIZATION = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [BLOCK, BLOCK],
}

# DeepSeek-V3's config.json, the sizes that shape the checkpoint.
CONFIG = {
    "model_type": "deepseek_v3",
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1,
    "first_k_dense_replace": 3,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "tie_word_embeddings": False,
    "topk_method": "noaux_tc",  # the router's e_score_correction_bias
    "quantization_config": QUANTIZATION,
}
# The same model exported unquantized (BF16): no scales, no quantization_config.
UNQUANTIZED = {k: v for k, v in CONFIG.items() if k != "quantization_config"}

RAW_SAFE_OPEN = r"""
import json, os, sys
from safetensors import safe_open
folder = sys.argv[1]
index = json.load(open(os.path.join(folder, "model.safetensors.index.json")))
n = 0
for file in sorted(set(index["weight_map"].values())):
    with safe_open(os.path.join(folder, file), framework="numpy") as f:
        for key in f.keys():
            f.get_slice(key).get_shape()
            n += 1
print(n)
"""


def linear(
    name: str, out_features: int, in_features: int, c: dict
) -> list[tuple[str, str, list[int]]]:
    """A linear as DeepSeek-V3 ships it: the FP8 weight and its block scales (an unquantized
    export, ``quantization_config`` absent from ``c``: one BF16 weight)."""
    if "quantization_config" not in c:
        return [(f"{name}.weight", "BF16", [out_features, in_features])]
    scales = [math.ceil(out_features / BLOCK), math.ceil(in_features / BLOCK)]
    return [
        (f"{name}.weight", "F8_E4M3", [out_features, in_features]),
        (f"{name}.weight_scale_inv", "F32", scales),
    ]


def decoder_layer(i: int, c: dict) -> list[tuple[str, str, list[int]]]:
    h, p = c["hidden_size"], f"model.layers.{i}"
    heads, nope, rope, v = (c[k] for k in ("num_attention_heads", "qk_nope_head_dim",
                                           "qk_rope_head_dim", "v_head_dim"))  # fmt: skip
    out = [
        (f"{p}.input_layernorm.weight", "BF16", [h]),
        (f"{p}.post_attention_layernorm.weight", "BF16", [h]),
        (f"{p}.self_attn.q_a_layernorm.weight", "BF16", [c["q_lora_rank"]]),
        (f"{p}.self_attn.kv_a_layernorm.weight", "BF16", [c["kv_lora_rank"]]),
    ]
    a = f"{p}.self_attn"
    out += linear(f"{a}.q_a_proj", c["q_lora_rank"], h, c)
    out += linear(f"{a}.q_b_proj", heads * (nope + rope), c["q_lora_rank"], c)
    out += linear(f"{a}.kv_a_proj_with_mqa", c["kv_lora_rank"] + rope, h, c)
    out += linear(f"{a}.kv_b_proj", heads * (nope + v), c["kv_lora_rank"], c)
    out += linear(f"{a}.o_proj", h, heads * v, c)
    if i < c["first_k_dense_replace"]:
        out += mlp(f"{p}.mlp", h, c["intermediate_size"], c)
        return out
    out += [
        (f"{p}.mlp.gate.weight", "BF16", [c["n_routed_experts"], h]),
        (f"{p}.mlp.gate.e_score_correction_bias", "F32", [c["n_routed_experts"]]),
    ]
    for e in range(c["n_routed_experts"]):
        out += mlp(f"{p}.mlp.experts.{e}", h, c["moe_intermediate_size"], c)
    shared = c["moe_intermediate_size"] * c["n_shared_experts"]
    out += mlp(f"{p}.mlp.shared_experts", h, shared, c)
    return out


def mlp(p: str, h: int, inter: int, c: dict) -> list[tuple[str, str, list[int]]]:
    return [
        *linear(f"{p}.gate_proj", inter, h, c),
        *linear(f"{p}.up_proj", inter, h, c),
        *linear(f"{p}.down_proj", h, inter, c),
    ]


def layout(c: dict) -> list[tuple[str, str, list[int]]]:
    """Every tensor of the checkpoint, in the published checkpoint's order of layers."""
    h, vocab, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    out = [("model.embed_tokens.weight", "BF16", [vocab, h])]
    for i in range(n):
        out += decoder_layer(i, c)
    for i in range(n, n + c["num_nextn_predict_layers"]):  # the multi-token-prediction layer
        p = f"model.layers.{i}"
        out += decoder_layer(i, c)
        out += [
            (f"{p}.embed_tokens.weight", "BF16", [vocab, h]),
            (f"{p}.enorm.weight", "BF16", [h]),
            (f"{p}.hnorm.weight", "BF16", [h]),
            (f"{p}.eh_proj.weight", "BF16", [h, 2 * h]),
            (f"{p}.shared_head.norm.weight", "BF16", [h]),
            (f"{p}.shared_head.head.weight", "BF16", [vocab, h]),
        ]
    return [*out, ("model.norm.weight", "BF16", [h]), ("lm_head.weight", "BF16", [vocab, h])]


ITEMSIZE = {"BF16": 2, "F32": 4, "F8_E4M3": 1}


def write_layout(folder: Path, config: dict, shards: int = SHARDS) -> tuple[int, int]:
    """The sharded checkpoint (sparse shards, an index, config.json); (tensors, bytes on paper)."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = layout(config)
    per = -(-len(tensors) // shards)
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:06d}.safetensors"
        part = tensors[s * per : (s + 1) * per]
        entries = {n: (d, shape, ITEMSIZE[d]) for n, d, shape in part}
        write_sparse_safetensors(folder / file, entries)
        total += sum(ITEMSIZE[d] * math.prod(shape) for _, d, shape in part)
        weight_map.update(dict.fromkeys((n for n, _, _ in part), file))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return len(tensors), total


def _time(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``cmd`` (``inspect_speed.timed``)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return timed(cmd, env)


class Sides(NamedTuple):
    """Medians of two commands run alternately: wall and CPU seconds of each."""

    a_s: float
    b_s: float
    a_cpu_s: float
    b_cpu_s: float


def side_by_side(a: list[str], b: list[str], runs: int) -> Sides:
    """Medians of ``a`` and ``b``, run alternately after one warm-up each."""
    _time(a), _time(b)
    ta, tb = [], []
    for _ in range(runs):
        ta.append(_time(a))
        tb.append(_time(b))
    wall = (statistics.median(w for w, _ in t) for t in (ta, tb))
    cpu = (statistics.median(c for _, c in t) for t in (ta, tb))
    return Sides(*wall, *cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-model", action="store_true", help="header-only measurement only")
    ap.add_argument("--hf-causal", action="store_true", help="also the forced dense wrapper")
    args = ap.parse_args()
    py = sys.executable
    full = OUT / "deepseek-v3"
    n, nbytes = write_layout(full, CONFIG)
    t = side_by_side(inspect(full), [py, "-c", RAW_SAFE_OPEN, str(full)], args.runs)
    results = [{"case": "header-only", "shards": SHARDS, "tensors": n, "bytes": nbytes,
                "inspect_cpu_s": round(t.a_cpu_s, 3), "safe_open_cpu_s": round(t.b_cpu_s, 3),
                "ratio": round(t.a_cpu_s / t.b_cpu_s, 3),
                "inspect_s": round(t.a_s, 3), "safe_open_s": round(t.b_s, 3),
                "wall_ratio": round(t.a_s / t.b_s, 3),
                "load_average": round(os.getloadavg()[0], 2)}]  # fmt: skip
    print(json.dumps(results[-1]), flush=True)
    if args.skip_model:
        return 0
    bf16 = OUT / "deepseek-v3-bf16"
    n_bf16, _ = write_layout(bf16, UNQUANTIZED)
    for folder, names, loader in ((full, n, "all"), (bf16, n_bf16, "all"), (bf16, n_bf16, "vllm")):
        results.append(model_hf(folder, names, args.runs, loader))
        print(json.dumps(results[-1]), flush=True)
    if args.hf_causal:
        results += linearity(bf16, n_bf16, args.runs)
    return 0


def inspect(folder: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "loadkit_inspect", "inspect", str(folder), *flags]


def model_hf(folder: Path, names: int, runs: int, loader: str = "all") -> dict:
    """``--model hf --loader LOADER`` against the header-only inspect of ``folder``,
    alternating (``vllm``: the dry load alone, without ``from_pretrained``'s)."""
    flags = ("--model", "hf", "--loader", loader)
    t = side_by_side(inspect(folder, *flags), inspect(folder), runs)
    return {"case": f"--model hf --loader {loader} {folder.name}", "tensors": names,
            "model_hf_cpu_s": round(t.a_cpu_s, 3), "header_only_cpu_s": round(t.b_cpu_s, 3),
            "ratio": round(t.a_cpu_s / t.b_cpu_s, 2), "model_hf_s": round(t.a_s, 3),
            "header_only_s": round(t.b_s, 3), "wall_ratio": round(t.a_s / t.b_s, 2),
            "load_average": round(os.getloadavg()[0], 2)}  # fmt: skip


def linearity(full: Path, n: int, runs: int) -> list[dict]:
    """``--model hf-causal`` at the full layout and a quarter of its layers: seconds per name."""
    quarter = OUT / "deepseek-v3-bf16-quarter"
    layers = UNQUANTIZED["num_hidden_layers"] // 4
    n_small, _ = write_layout(quarter, dict(UNQUANTIZED, num_hidden_layers=layers))
    results, per_name = [], {}
    for folder, names in ((full, n), (quarter, n_small)):
        times = [_time(inspect(folder, "--model", "hf-causal")) for _ in range(runs)]
        cpu = statistics.median(c for _, c in times)
        per_name[folder.name] = cpu / names
        results.append({"case": f"--model hf-causal {folder.name}", "tensors": names,
                        "inspect_s": round(statistics.median(w for w, _ in times), 3),
                        "inspect_cpu_s": round(cpu, 3),
                        "cpu_us_per_name": round(1e6 * cpu / names, 2)})  # fmt: skip
        print(json.dumps(results[-1]), flush=True)
    growth = per_name[full.name] / per_name[quarter.name]
    results.append({"case": "linearity", "per_name_full_over_quarter": round(growth, 3)})
    print(json.dumps(results[-1]))
    return results


if __name__ == "__main__":
    raise SystemExit(main())
