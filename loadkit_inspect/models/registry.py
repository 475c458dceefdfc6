"""Models by name, for ``loadkit inspect --model``: built-ins, any Hugging Face architecture
(``hf``), or any ``package.module:callable``.

``hf`` (also ``hf:PATH``, ``hf-causal``, ``hf-embed``, ``hf-classify``) reads a ``config.json``
and builds transformers' own model wrapped as vLLM's Transformers backend wraps it
(``loadkit.models.transformers``). Built-ins are sized from the checkpoint: each model module
provides
``config_from_checkpoint(tensors)`` (name -> ``TensorInfo``) and its model class, which is built
under ``torch.device("meta")`` so no memory is used. The table below is lazy (strings), so naming a
model imports only that model's module.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadkit.errors import LoadkitError, ModelSpecError

if TYPE_CHECKING:
    from torch import nn

    from loadkit.checkpoint import Checkpoint, TensorInfo

# name -> "module:attr"; attr is the model class, constructed as cls(config_from_checkpoint(...)).
BUILTIN: dict[str, str] = {
    "gemma4-like": "loadkit.models.gemma4:Gemma4ForConditionalGeneration",
    "plamo2": "loadkit.models.plamo2:Plamo2ForCausalLM",
    "nemotron-h": "loadkit.models.nemotron_h:NemotronHForCausalLM",
    "llama-like": "loadkit.models.llama:LlamaForCausalLM",
    "vision-tower": "loadkit.models.vision_tower:VisionTower",
}


# Specs read from a Hugging Face config.json (loadkit_inspect.models.hf.HF_SPECS, tested):
# name -> the wrapper it builds ("architecture": picked from the config, as upstream).
FROM_CONFIG: dict[str, str] = {
    "hf": "architecture",
    "hf-causal": "TransformersForCausalLM",
    "hf-embed": "TransformersEmbeddingModel",
    "hf-classify": "TransformersForSequenceClassification",
}


def _import(module_name: str, spec: str) -> Any:
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ModelSpecError(f"--model {spec!r}: no such file {module_name}")
        mod_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules.setdefault(path.stem, module)
        try:
            mod_spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            raise ModelSpecError(
                f"--model {spec!r}: importing {module_name} failed: {_describe(exc)}"
            ) from exc
        return module
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ModelSpecError(
                f"--model {spec!r}: no module named {module_name!r} (run from the folder that "
                "holds it, or put it on PYTHONPATH)"
            ) from None
        raise ModelSpecError(
            f"--model {spec!r}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from exc
    except (Exception, SystemExit) as exc:
        raise ModelSpecError(
            f"--model {spec!r}: importing {module_name} failed: {_describe(exc)}"
        ) from exc


def _describe(exc: BaseException) -> str:
    """``Type: message`` on one line; a ``SystemExit`` says that the code tried to exit."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}) instead of returning"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _attr(obj: Any, dotted: str, spec: str) -> Any:
    for part in dotted.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ModelSpecError(
                f"--model {spec!r}: {getattr(obj, '__name__', obj)!s} has no attribute {part!r}"
            ) from None
    return obj


def _wants_tensors(fn: Callable[..., Any], given: Mapping[str, Any] | None = None) -> bool:
    """Does ``fn`` take a required positional argument (the checkpoint's tensors) besides the
    keyword arguments ``given``?"""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return any(
        p.default is p.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.name not in (given or {})
        for p in sig.parameters.values()
    )


def _check_args(fn: Callable[..., Any], kwargs: Mapping[str, Any], label: str) -> None:
    """Fail before the build when ``fn`` cannot take the ``--model-arg`` names."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    params = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in kwargs:
        if key not in names:
            takes = ", ".join(names) or "no keyword arguments"
            raise ModelSpecError(
                f"--model-arg {key}=...: {label} takes no argument {key!r} (it takes: {takes})"
            )


def _call(
    fn: Callable[..., Any], tensors: Mapping[str, TensorInfo], kwargs: Mapping[str, Any]
) -> Any:
    return fn(tensors, **kwargs) if _wants_tensors(fn, kwargs) else fn(**kwargs)


def _on_meta(build: Callable[[], Any], spec: str) -> nn.Module:
    from torch import nn

    from loadkit.loading import on_meta

    try:
        with on_meta():
            model = build()
    except LoadkitError:
        raise
    except (Exception, SystemExit) as exc:  # user code: a SystemExit must not end the run
        raise ModelSpecError(
            f"--model {spec!r}: building the model on the meta device failed: {_describe(exc)}"
        ) from exc
    if not isinstance(model, nn.Module):
        raise ModelSpecError(
            f"--model {spec!r} returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def build_builtin(name: str, tensors: Mapping[str, TensorInfo]) -> nn.Module:
    """The built-in model ``name``, sized from ``tensors``, on the meta device."""
    target = BUILTIN[name]
    module_name, attr = target.split(":")
    if importlib.util.find_spec(module_name) is None:
        raise ModelSpecError(
            f"--model {name!r}: the built-in model lives in {module_name}, which this checkout "
            "does not have yet"
        )
    module = _import(module_name, name)
    cls = _attr(module, attr, name)
    sizer = _attr(module, "config_from_checkpoint", name)
    try:
        config = sizer(tensors)  # a LoadkitError: the checkpoint does not look like this model
    except LoadkitError:
        raise
    except Exception as exc:  # hostile but valid shapes the sizer did not foresee
        raise ModelSpecError(
            f"--model {name!r}: the checkpoint's names and shapes do not describe a {name} "
            f"model ({_describe(exc)})"
        ) from exc
    return _on_meta(lambda: cls(config), name)


def build_model(
    spec: str | nn.Module | Callable[..., nn.Module],
    tensors: Mapping[str, TensorInfo],
    model_args: Mapping[str, Any] | None = None,
    *,
    checkpoint: str | Checkpoint | None = None,
    model_impl: str = "auto",
) -> tuple[nn.Module, str]:
    """``(model on meta, label)`` for a built-in name, an ``hf`` spec (its ``config.json`` next
    to ``checkpoint``, a path or an opened checkpoint, or at the spec's path), a
    ``module:callable`` spec, a callable or a module. A callable taking one argument gets the
    checkpoint's ``tensors`` to size itself; ``model_args`` are passed to a callable as keyword
    arguments (``--model-arg key=value``); ``model_impl`` is vLLM's ``--model-impl`` for an
    ``hf`` spec (``loadkit_inspect.models.vllm``)."""
    kwargs = dict(model_args or {})
    if not isinstance(spec, str):
        from torch import nn

        if isinstance(spec, nn.Module) and not kwargs:
            from loadkit.loading import meta_copy

            return meta_copy(spec, always=True), type(spec).__name__
        if callable(spec) and not isinstance(spec, nn.Module):
            label = getattr(spec, "__qualname__", repr(spec))
            fn = spec
            _check_args(fn, kwargs, label)
            return _on_meta(lambda: _call(fn, tensors, kwargs), label), label
        if kwargs:
            raise ModelSpecError("model arguments need a callable model, not a module")
        raise ModelSpecError(f"model must be a name, a spec, a callable or a module, not {spec!r}")
    if spec in BUILTIN:
        if kwargs:
            raise ModelSpecError(
                f"--model {spec!r}: a built-in model is sized from the checkpoint and takes no "
                "--model-arg"
            )
        return build_builtin(spec, tensors), spec
    if spec.partition(":")[0] in FROM_CONFIG:
        if kwargs:
            raise ModelSpecError(
                f"--model {spec!r}: a model built from a config.json takes no --model-arg"
            )
        from loadkit_inspect.models.hf import build_from_source, read_hf_source

        source = read_hf_source(spec, checkpoint)  # the usual mistakes fail before torch loads
        build = lambda: build_from_source(source, device="meta", model_impl=model_impl)  # noqa: E731
        return _on_meta(build, spec), spec
    if ":" not in spec:
        raise ModelSpecError(
            f"--model {spec!r}: not a built-in model ({', '.join(BUILTIN)}), not "
            f"{' / '.join(FROM_CONFIG)} (a Hugging Face config.json), and not a "
            "'package.module:callable' (or 'file.py:callable') spec"
        )
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ModelSpecError(f"--model {spec!r}: expected 'package.module:callable'")
    fn = _attr(_import(module_name, spec), attr, spec)
    if not callable(fn):
        raise ModelSpecError(f"--model {spec!r}: {attr} is not callable")
    _check_args(fn, kwargs, spec)
    return _on_meta(lambda: _call(fn, tensors, kwargs), spec), spec
