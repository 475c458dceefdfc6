"""What a load fills: a module's parameters and persistent buffers, by qualified name.

One definition for every part that asks (``AutoWeightsLoader`` per module, the ledger and the
dry load for a whole model), and the one way names are joined to their module's path.
Layerwise reload counts differently on purpose (every direct buffer, as upstream does).

Also which names are aliases of a tied word embedding (``tied_embedding_aliases``), the names
``AutoWeightsLoader`` skips since vLLM 0.29.0.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn


def qualname(prefix: str, rest: str) -> str:
    """``rest`` under the module path ``prefix``.

    >>> qualname("model.layers.0", "mlp.weight"), qualname("", "lm_head.weight")
    ('model.layers.0.mlp.weight', 'lm_head.weight')
    """
    if not prefix:
        return rest
    if not rest:
        return prefix
    return f"{prefix}.{rest}"


def walk_modules(
    module: nn.Module, *, remove_duplicate: bool = True
) -> list[tuple[str, nn.Module]]:
    """``module.named_modules(remove_duplicate=...)`` as a list, in the same order, without
    torch's nested generators (one step per module, not one per level: a loader walks a
    DeepSeek-sized tree once per pass of the dry load).

    >>> [name for name, _ in walk_modules(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))]
    ['', '0', '1']
    """
    out: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", module)]
    while stack:
        path, mod = stack.pop()
        if remove_duplicate:
            if id(mod) in seen:
                continue
            seen.add(id(mod))
        out.append((path, mod))
        children = [(qualname(path, n), c) for n, c in mod._modules.items() if c is not None]
        stack.extend(reversed(children))
    return out


def submodules(module: nn.Module) -> list[nn.Module]:
    """Every module under ``module`` (itself first), each as often as it is registered: the
    modules of ``walk_modules(module, remove_duplicate=False)`` without their names, for checks
    that need none.

    >>> len(submodules(nn.Sequential(nn.Linear(2, 2), nn.ReLU())))
    3
    """
    out: list[nn.Module] = []
    stack = [module]
    while stack:
        mod = stack.pop()
        out.append(mod)
        stack.extend(reversed([c for c in mod._modules.values() if c is not None]))
    return out


def named_parameters(
    module: nn.Module, *, remove_duplicate: bool = True
) -> Iterator[tuple[str, nn.Parameter]]:
    """``module.named_parameters(remove_duplicate=...)``, over ``walk_modules``: the same names
    in the same order.

    >>> [name for name, _ in named_parameters(nn.Sequential(nn.Linear(2, 2, bias=False)))]
    ['0.weight']
    """
    seen: set[int] = set()
    for path, mod in walk_modules(module, remove_duplicate=remove_duplicate):
        for name, param in mod._parameters.items():
            if param is None or id(param) in seen:
                continue
            if remove_duplicate:
                seen.add(id(param))
            yield qualname(path, name), param


def named_loadable(
    module: nn.Module, *, recurse: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter, then every persistent buffer (BatchNorm's running stats among them), by
    qualified name; a tied tensor under each of its names. ``recurse=False``: ``module``'s own."""
    if recurse:
        yield from named_parameters(module, remove_duplicate=False)
    else:
        yield from module.named_parameters(recurse=False, remove_duplicate=False)
    for path, mod in walk_modules(module) if recurse else [("", module)]:
        for name, buf in mod._buffers.items():
            if buf is not None and name not in mod._non_persistent_buffers_set:
                yield qualname(path, name), buf


def loadable_tensors(module: nn.Module, *, recurse: bool = True) -> dict[str, torch.Tensor]:
    """``named_loadable``, each tensor once under its first name (the ledger's name for it).

    >>> bn = torch.nn.BatchNorm1d(2)
    >>> list(loadable_tensors(bn))
    ['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
    """
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in named_loadable(module, recurse=recurse):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out[name] = tensor
    return out


class VocabEmbedding(nn.Module):
    """A module holding a vocabulary's rows: what vLLM calls a ``VocabParallelEmbedding`` (its
    ``ParallelLMHead`` among them). ``loadkit.parallel.VocabParallelEmbedding`` is one; so is
    every ``torch.nn.Embedding`` (``VOCAB_EMBEDDINGS``)."""


# Upstream's check is isinstance(module, VocabParallelEmbedding); its Transformers backend puts
# one in place of the input embedding. loadkit keeps transformers' nn.Embedding there, so an
# nn.Embedding counts too (docs/fidelity.md).
VOCAB_EMBEDDINGS: tuple[type[nn.Module], ...] = (nn.Embedding, VocabEmbedding)


def tied_embedding_aliases(module: nn.Module) -> dict[str, str]:
    """Each name of a tied word-embedding parameter after its first -> that first name.

    vLLM 0.34.0's ``_get_tied_embedding_params``: over every vocabulary embedding
    (``VOCAB_EMBEDDINGS``) in module order, a parameter met again under another name is an
    alias of the first. ``AutoWeightsLoader`` skips the aliases: loading both names would write
    the one storage twice.

    >>> class Tied(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.embed_tokens = nn.Embedding(4, 2)
    ...         self.lm_head = nn.Embedding(4, 2)
    ...         self.lm_head.weight = self.embed_tokens.weight
    >>> tied_embedding_aliases(Tied())
    {'lm_head.weight': 'embed_tokens.weight'}
    """
    embeddings = [m for m in submodules(module) if isinstance(m, VOCAB_EMBEDDINGS)]
    held = [id(p) for m in embeddings for _, p in m.named_parameters(remove_duplicate=False)]
    if len(held) == len(set(held)):
        return {}  # no parameter met twice: nothing tied (the usual case, found without names)
    canonical: dict[int, str] = {}
    aliased: dict[str, str] = {}
    for prefix, sub in walk_modules(module, remove_duplicate=False):
        if not isinstance(sub, VOCAB_EMBEDDINGS):
            continue
        for name, param in sub.named_parameters(remove_duplicate=False):
            qual = qualname(prefix, name)
            first = canonical.setdefault(id(param), qual)
            if first != qual:
                aliased[qual] = first
    return aliased
