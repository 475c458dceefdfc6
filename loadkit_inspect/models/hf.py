"""``--model hf``: the spec grammar and the builder the registry calls.

``hf`` reads ``config.json`` next to the checkpoint; ``hf:PATH`` a config file or a folder
holding one. ``hf-causal``, ``hf-embed`` and ``hf-classify`` (each also ``:PATH``) name the
wrapper instead of letting the architecture pick it. This module imports neither torch nor
transformers: the registry checks a spec with it before anything heavy is loaded.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from loadkit.errors import LoadkitError, ModelSpecError

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig

    from loadkit.checkpoint import Checkpoint
    from loadkit_inspect.models.vllm import VllmClass

# spec name -> wrapper task (None: chosen from the config's architecture, as upstream)
HF_SPECS: dict[str, str | None] = {
    "hf": None,
    "hf-causal": "causal",
    "hf-embed": "embed",
    "hf-classify": "classify",
}


class HFSpec(NamedTuple):
    task: str | None
    config: str | None  # the PATH of hf:PATH; None: the checkpoint's own folder


def parse_hf_spec(spec: str) -> HFSpec | None:
    """``HFSpec`` for ``hf``, ``hf:PATH``, ``hf-embed:PATH``...; ``None`` for any other spec.

    >>> parse_hf_spec("hf"), parse_hf_spec("hf-embed:cfg.json"), parse_hf_spec("pkg.mod:fn")
    (HFSpec(task=None, config=None), HFSpec(task='embed', config='cfg.json'), None)
    """
    name, colon, path = spec.partition(":")
    if name not in HF_SPECS:
        return None
    if colon and not path:
        raise ModelSpecError(f"--model {spec!r}: give a config file or folder after the colon")
    return HFSpec(HF_SPECS[name], path or None)


class HFSource(NamedTuple):
    """What an ``hf`` spec resolves to before anything heavy is imported."""

    task: str | None
    path: str  # the config.json
    data: dict[str, Any]  # its JSON, with a model_type


def read_hf_source(spec: str, checkpoint: str | os.PathLike[str] | Checkpoint | None) -> HFSource:
    """Find and read the spec's ``config.json``: a missing file, bad JSON or no ``model_type``
    fails here, before torch and transformers are imported (seconds). A remote checkpoint's
    config is the ``config.json`` beside it, fetched (and counted in its ``fetched``)."""
    parsed = parse_hf_spec(spec)
    if parsed is None:
        raise ModelSpecError(f"--model {spec!r} is not an hf spec")
    source = parsed.config or checkpoint
    if source is None:
        raise ModelSpecError(f"--model {spec!r}: no checkpoint folder to read config.json from")
    from loadkit.checkpoint import Checkpoint
    from loadkit.models.transformers import config_path, read_config_dict
    from loadkit_inspect.sources.resolve import is_url

    if isinstance(source, Checkpoint) and is_url(source.path):
        return _remote_source(spec, parsed.task, source)
    if isinstance(source, Checkpoint):
        source = source.path

    path = config_path(source, given=parsed.config is not None)
    return HFSource(parsed.task, str(path), read_config_dict(path))


def _remote_source(spec: str, task: str | None, checkpoint: Checkpoint) -> HFSource:
    """The ``config.json`` beside a remote checkpoint, fetched (and counted in its tally)."""
    from loadkit.errors import CheckpointError
    from loadkit.models.transformers import CONFIG_NAME, config_dict
    from loadkit_inspect.sources.remote import RemoteCheckpoint

    if not isinstance(checkpoint, RemoteCheckpoint):
        raise ModelSpecError(f"--model {spec!r}: {checkpoint.path} was not opened as a URL")
    try:
        url, raw = checkpoint.fetch_beside(CONFIG_NAME)
        text = raw.decode("utf-8")
    except (CheckpointError, UnicodeDecodeError) as exc:
        raise ModelSpecError(
            f"--model {spec!r} reads the {CONFIG_NAME} beside the remote checkpoint: {exc} "
            "(give a local one with --model hf:PATH)"
        ) from None
    return HFSource(task, url, config_dict(text, url))


def build_from_source(
    source: HFSource, *, device: str = "meta", model_impl: str = "auto"
) -> nn.Module:
    """transformers' config from ``source``, and the model vLLM 0.34.0 would build for it
    (``loadkit_inspect.models.vllm.resolve``), on ``device``.

    vLLM's own class where loadkit re-implements it (``loadkit.models.native``); otherwise the
    Transformers backend's wrapper, which stands in for the load section when vLLM would use a
    class loadkit does not model (the ``vllm`` verdict then says it was not checked). The model
    carries ``vllm_class`` (which class, why), ``vllm_unmodelled`` (``None``, or why the vllm
    column is not checked), ``hf_config`` and ``config_source``; transformers stays quiet.
    """
    with quiet_transformers():
        return _built(source, device, model_impl)


def _built(source: HFSource, device: str, model_impl: str) -> nn.Module:
    from loadkit.models.transformers import config_from_dict
    from loadkit_inspect.models.vllm import resolve

    config = config_from_dict(source.data, source.path)
    if source.task is not None:
        choice = _asked_for(config, source.task)
    else:
        choice = resolve(config, model_impl)
        _known_somewhere(choice, source.path)
    unmodelled = _quantized(config, choice) or _unmodelled(choice, config)
    if choice.native and unmodelled is None:
        model = _native(config, choice, source.path, device)
    else:
        model = _backend_wrapper(config, source, choice, device, unmodelled is not None)
    # Plain attributes for the report (the model's own code never reads them).
    for name, value in (
        ("vllm_class", choice),
        ("vllm_unmodelled", unmodelled),
        ("hf_config", config),
        ("config_source", source.path),
    ):
        object.__setattr__(model, name, value)
    return model


# The backend's wrappers loadkit re-implements, by the task they serve.
BACKEND_TASKS = {
    "TransformersForCausalLM": "causal",
    "TransformersEmbeddingModel": "embed",
    "TransformersForSequenceClassification": "classify",
}


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' warnings (a config's validation, a load report) and progress bars turned
    down for this block only, through its public switches, then restored: they would print
    around loadkit's own report, and on stderr under ``--json``, which holds errors alone."""
    try:
        from transformers.utils import logging
    except ImportError:  # not installed: the build says so, in its own words
        yield
        return
    verbosity = logging.get_verbosity()
    bars = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _known_somewhere(choice: VllmClass, path: str) -> None:
    """An architecture vLLM refuses that transformers has no class for either is bad input."""
    from loadkit_inspect.models.vllm import known_to_transformers, nearest_known

    arch = choice.architecture
    if choice.refusal is None or arch is None or known_to_transformers(arch):
        return
    import transformers

    near = nearest_known(arch)
    hint = f"; nearest known: {', '.join(near)}" if near else ""
    raise ModelSpecError(
        f"{path}: architectures[0] {arch!r}: neither vLLM 0.34.0 nor transformers "
        f"{transformers.__version__} knows this architecture{hint}"
    )


def _asked_for(config: PretrainedConfig, task: str) -> VllmClass:
    from loadkit.models.transformers import WRAPPERS
    from loadkit_inspect.models.vllm import VllmClass

    if task not in WRAPPERS:
        raise ModelSpecError(f"unknown wrapper {task!r}; choose from {', '.join(WRAPPERS)}")
    name = WRAPPERS[task].__name__
    architectures = list(getattr(config, "architectures", None) or [])
    arch = architectures[0] if architectures else None
    return VllmClass(name, arch, False, f"asked for ({task})")


def _backend_checks(config: PretrainedConfig) -> bool:
    """Would ``--model-impl transformers`` check this config (a backend wrapper loadkit
    re-implements, no refusal)?"""
    from loadkit_inspect.models.vllm import resolve

    backend = resolve(config, "transformers")
    return backend.refusal is None and backend.name in BACKEND_TASKS


def _unmodelled(choice: VllmClass, config: PretrainedConfig) -> str | None:
    """``None`` when loadkit models the class vLLM would use, else why the vllm column is not
    checked (pointing at ``--model-impl transformers`` where the backend would check
    ``config``)."""
    from loadkit.models.native import CLASSES

    if choice.name is None:
        return None  # vLLM refuses: that is the verdict
    if choice.name.startswith("remote code"):
        return f"vLLM 0.34.0 would run {choice.name}: {choice.why}"
    if choice.adapter is not None:
        return (
            f"vLLM 0.34.0 would serve {choice.architecture} as its native {choice.name} turned "
            f"into a {choice.adapter} model by its pooling adapter, which loadkit does not "
            "re-implement"
        )
    if choice.native and choice.name not in CLASSES:
        hint = "; --model-impl transformers checks the Transformers backend instead"
        return (
            f"vLLM 0.34.0 would use its native {choice.name}, which loadkit does not "
            f"re-implement{hint if _backend_checks(config) else ''}"
        )
    if not choice.native and choice.name not in BACKEND_TASKS:
        return (
            f"vLLM 0.34.0 would use the Transformers backend's {choice.name}, whose fused "
            "layers loadkit does not re-implement"
        )
    return None


def _quantized(config: PretrainedConfig, choice: VllmClass) -> str | None:
    """Why the vllm column is not checked for a quantized checkpoint (``quantization_config``
    in its config.json, as DeepSeek-V3's FP8 one has), or ``None``: vLLM builds its layers with
    the quantization's parameters (``weight_scale_inv``...), which loadkit does not model."""
    method = quant_method(config)
    if choice.name is None or method is None:
        return None
    return (
        f"vLLM 0.34.0 would build {choice.name} quantized ({method!r} from the config's "
        "quantization_config), whose quantized layers loadkit does not re-implement"
    )


def quant_method(config: Any) -> str | None:
    """The ``quant_method`` of ``config``'s ``quantization_config`` (``"unnamed"`` where it
    names none), or ``None`` for an unquantized config.

    >>> from types import SimpleNamespace as C
    >>> quant_method(C(quantization_config={"quant_method": "fp8"})), quant_method(C())
    ('fp8', None)
    """
    quant = getattr(config, "quantization_config", None)
    if not quant:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return str(method or getattr(quant, "quant_method", None) or "unnamed")


def _native(config: PretrainedConfig, choice: VllmClass, path: str, device: str) -> nn.Module:
    import torch

    from loadkit.models.native import native_class
    from loadkit.models.transformers import one_line

    assert choice.name is not None
    cls = native_class(choice.name)
    try:
        with torch.device(device):
            return cls(config)
    except LoadkitError:
        raise
    except Exception as exc:
        field = getattr(exc, "name", None) if isinstance(exc, AttributeError) else None
        where = f"field {field!r}: " if field else ""
        raise ModelSpecError(
            f"{path}: {where}vLLM 0.34.0's {choice.name} cannot be built from this config "
            f"({one_line(exc)})"
        ) from exc


def _backend_wrapper(
    config: PretrainedConfig, source: HFSource, choice: VllmClass, device: str, unmodelled: bool
) -> nn.Module:
    """The Transformers backend's wrapper: the one vLLM uses, the plain one of the same task
    standing in for a refused architecture, or (``unmodelled``) one built in place of a class
    loadkit does not model, for the report's model section only (no vLLM load is simulated)."""
    from loadkit.models.transformers import WRAPPERS, one_line
    from loadkit_inspect.models.vllm import backend_class

    name = choice.name if choice.name and choice.name.startswith("Transformers") else None
    name = name or backend_class(config)
    task = source.task or next(
        (t for n, t in BACKEND_TASKS.items() if name.endswith(n.removeprefix("Transformers"))),
        "causal",
    )
    wrapper = WRAPPERS[task]
    try:
        model = wrapper(config, device=device)
    except ModelSpecError:
        raise
    except Exception as exc:
        raise ModelSpecError(
            f"{source.path}: transformers cannot build the {config.model_type!r} model: "
            f"{one_line(exc)}"
        ) from exc
    if choice.name == wrapper.__name__:
        model.wrapper_reason = choice.why
    elif unmodelled:
        model.wrapper_reason = (
            f"built in place of {choice.name} (the vllm column is not checked): no vLLM load "
            "simulated"
        )
    else:
        model.wrapper_reason = (
            f"standing in for {choice.name or 'the refused architecture'}: {task}"
        )

    return model
