"""``--model hf``: the spec grammar and the builder the registry calls.

``hf`` reads ``config.json`` next to the checkpoint; ``hf:PATH`` a config file or a folder
holding one. ``hf-causal``, ``hf-embed`` and ``hf-classify`` (each also ``:PATH``) name the
wrapper instead of letting the architecture pick it. This module imports neither torch nor
transformers: the registry checks a spec with it before anything heavy is loaded.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple

from loadkit.errors import ModelSpecError

if TYPE_CHECKING:
    from torch import nn

    from loadkit.checkpoint import Checkpoint

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


def build_from_source(source: HFSource, *, device: str = "meta") -> nn.Module:
    """transformers' config from ``source``, and the wrapper picked for it, on ``device``."""
    from loadkit.models.transformers import choose_wrapper, config_from_dict, one_line

    config = config_from_dict(source.data, source.path)
    choice = choose_wrapper(config, source.task)
    try:
        model = choice.wrapper(config, device=device)
    except ModelSpecError:
        raise
    except Exception as exc:
        raise ModelSpecError(
            f"{source.path}: transformers cannot build the {config.model_type!r} model: "
            f"{one_line(exc)}"
        ) from exc
    model.config_source = source.path
    model.wrapper_reason = choice.reason
    return model
