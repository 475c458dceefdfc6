"""What the built-in models share: one packed loader, one RMSNorm, one header look-up."""

import pytest
import torch

from loadkit.checkpoint.reader import TensorInfo
from loadkit.errors import CheckpointError, MissingShardIdError, ShapeMismatchError
from loadkit.models import gemma4, nemotron_h, plamo2
from loadkit.models._common import HeaderShapes, RMSNorm, packed_weight_loader, rms_norm, shard_rows


def test_every_built_in_model_uses_the_one_rmsnorm_and_packed_loader():
    with torch.device("meta"):
        models = [
            gemma4.Gemma4ForConditionalGeneration(),
            plamo2.Plamo2ForCausalLM(plamo2.Plamo2Config()),
            nemotron_h.NemotronHForCausalLM(),
        ]
    norms = {type(m) for model in models for m in model.modules() if "Norm" in type(m).__name__}
    assert norms == {RMSNorm}, norms
    packed = [
        p.weight_loader.__qualname__
        for model in models
        for p in model.parameters()
        if "packed" in getattr(getattr(p, "weight_loader", None), "__qualname__", "")
    ]
    assert packed and all(q.startswith("packed_weight_loader(") for q in packed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_torchs_in_float32_then_the_weight(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, generator=g).to(dtype)
    w = (torch.randint(-64, 65, (8,), generator=g) / 64).to(dtype)
    want = torch.nn.functional.rms_norm(x.float(), (8,), eps=1e-5).to(dtype) * w
    got = RMSNorm(8, eps=1e-5, dtype=dtype)
    with torch.no_grad():
        got.weight.copy_(w)
    assert got(x).dtype == dtype
    assert torch.equal(got(x), want) and torch.equal(rms_norm(x, w, 1e-5), want)


def test_packed_loader_takes_the_shard_from_the_argument_or_the_tensor():
    load = packed_weight_loader("p.weight", shard_rows({"q": 2, 0: 1}))
    param = torch.zeros(3, 2)
    tagged = torch.full((1, 2), 7.0)
    tagged.shard_id = 0
    load(param, torch.ones(2, 2), "q")
    load(param, tagged)
    assert param.tolist() == [[1, 1], [1, 1], [7, 7]]
    with pytest.raises(MissingShardIdError, match=r"'p\.weight'.*no shard_id"):
        load(param, torch.ones(2, 2))
    with pytest.raises(ShapeMismatchError, match=r"\[1, 2\].*\[2, 2\]"):
        load(param, torch.ones(2, 2), 0)


def test_header_shapes_name_file_key_and_shape():
    info = TensorInfo("a.w", "F32", (6,), 24, "m.safetensors", 8)
    header = HeaderShapes({"a.w": info}, "a test checkpoint")
    assert header.info("missing", "a.w") is info
    with pytest.raises(CheckpointError, match=r"m\.safetensors, key 'a\.w'.*2-d.*\[6\]"):
        header.shape("a.w", ndim=2)
    with pytest.raises(CheckpointError, match=r"key 'b'.*not a test checkpoint.*missing"):
        header.shape("b")


def test_rms_norm_matches_torch():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 5, generator=g), torch.randn(5, generator=g)
    want = torch.nn.functional.rms_norm(x, (5,), w, eps=1e-6)
    assert torch.allclose(rms_norm(x, w, 1e-6), want, atol=1e-6)
