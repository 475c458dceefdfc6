"""After a load: every module's own post-load hook, children first (vLLM 0.34.0's
``finalize_model_weights``, which "every load and update path finishes" with).

A module that turns the loaded checkpoint format into what it computes with (a transposed
kernel layout, a derived table) does it in ``process_weights_after_loading()``. Children run
before their parents, so a parent sees its submodules processed; a module shared by two parents
runs once, before either.
"""

from __future__ import annotations

from torch import nn


def _children_first(model: nn.Module) -> list[nn.Module]:
    """Every module once, each after all of its submodules, in upstream's depth-first order (a
    module two parents share runs under the first, before it)."""
    order: list[nn.Module] = []
    seen: set[int] = set()
    stack = [(model, iter(model._modules.values()))]
    while stack:
        module, children = stack[-1]
        for child in children:
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                stack.append((child, iter(child._modules.values())))
                break
        else:
            stack.pop()
            order.append(module)
    return order


def finalize_model_weights(model: nn.Module) -> list[str]:
    """Run each module's ``process_weights_after_loading()``, children first; return the
    qualified names of the modules whose hook ran, in order.

    Args:
        model: the loaded (or reloaded) model.

    Returns:
        The names of the modules whose hook ran, in the order they ran ("" for the root).

    >>> import torch
    >>> class Scaled(torch.nn.Linear):
    ...     def process_weights_after_loading(self):
    ...         self.weight.data.mul_(2)
    >>> model = torch.nn.Sequential(Scaled(1, 1, bias=False))
    >>> _ = torch.nn.init.ones_(model[0].weight)
    >>> finalize_model_weights(model), model[0].weight.item()
    (['0'], 2.0)
    """
    ran = []
    for module in _children_first(model):
        hook = getattr(module, "process_weights_after_loading", None)
        if callable(hook):
            hook()
            ran.append(module)
    if not ran:
        return []
    names = {id(m): n for n, m in model.named_modules()}
    return [names.get(id(m), "") for m in ran]
