"""Which leftover checkpoint key is which missing model tensor: pairing by shape and name.

After a load, some keys were not used (the model has no such name) and some tensors were never
filled. A renamed key has the element count of the tensor it should fill and a name that differs
in a few dotted components: a prefix (``bert.`` + name), a suffix (``gamma`` for ``weight``) or
one component in the middle. Each name is filed under a few *blocking keys* that such renames
share (the name without its first k components, without its last k, with one component
wildcarded), so candidates are found by dictionary lookups instead of comparing every key with
every tensor: the time is linear in the number of names. Each key explains at most one tensor
(best pairs first). Torch-free.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

STRIP = 3  # components a prefix or suffix rename may add or remove
BUCKET = 16  # a blocking key shared by more names than this says nothing: skipped
FULL_SCAN = 250_000  # name pairs compared exhaustively when blocking found nothing


class Named(NamedTuple):
    """One side of a pairing: the name compared, what it stands for, its element count."""

    name: str  # for a checkpoint key: the name the model was asked for (after the mapper)
    ident: str  # the checkpoint key, or the model tensor's name
    numel: int | None  # None: any size (nearest-name suggestions)
    shape: tuple[int, ...] | None = None  # an equal shape ranks a candidate higher


def _blocking_keys(name: str) -> Iterator[tuple[object, ...]]:
    parts = name.split(".")
    n = len(parts)
    for k in range(min(STRIP, n - 1) + 1):
        yield ("tail", ".".join(parts[k:]))  # a prefix of k components differs
        if k:
            yield ("head", ".".join(parts[: n - k]))  # a suffix of k components differs
    for i in range(n):
        yield ("one", n, i, ".".join([*parts[:i], "*", *parts[i + 1 :]]))


def shared_ends(a: Sequence[str], b: Sequence[str]) -> tuple[int, int]:
    """How many components ``a`` and ``b`` share at their start, then at their end (the end
    stops where the start did: no component counts twice). Pairing ranks by their sum;
    ``suggest`` turns what lies between them into a mapper rule.

    Example:
        >>> shared_ends("bert.pooler.dense.weight".split("."), "pooler.dense.weight".split("."))
        (0, 3)
        >>> shared_ends(["a", "b"], ["a", "b", "b"])
        (2, 0)
    """
    shortest = min(len(a), len(b))
    front = 0
    while front < shortest and a[front] == b[front]:
        front += 1
    back = 0
    while back < shortest - front and a[-1 - back] == b[-1 - back]:
        back += 1
    return front, back


def _shared(a: str, b: str) -> int:
    """Dotted components ``a`` and ``b`` share at their start plus at their end."""
    front, back = shared_ends(a.split("."), b.split("."))
    return front + back


class NameIndex:
    """Names filed under their blocking keys (and element count, when given)."""

    def __init__(self, items: Iterable[Named]) -> None:
        self.items = list(items)
        self._buckets: dict[tuple[object, ...], list[int]] = {}
        for i, item in enumerate(self.items):
            for key in _blocking_keys(item.name):
                self._buckets.setdefault((item.numel, *key), []).append(i)

    def candidates(self, name: str, numel: int | None) -> set[int]:
        """Indices of the names that share a blocking key with ``name`` (ambiguous keys skipped)."""
        found: set[int] = set()
        for key in _blocking_keys(name):
            bucket = self._buckets.get((numel, *key))
            if bucket and len(bucket) <= BUCKET:
                found.update(bucket)
        return found


def _likeness(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def _score(a: str, b: str) -> tuple[int, float]:
    return _shared(a, b), _likeness(a, b)


def _ranked(name: str, others: list[str]) -> list[str]:
    """``others`` best first by ``_score`` with ``name`` (ties in their given order). The name
    likeness (difflib, tens of microseconds a pair) is computed only where it decides: between
    candidates sharing as many components.

    Example:
        >>> _ranked("a.b.c", ["x.b.c", "a.b.x", "a.b.d", "q.r.s"])
        ['x.b.c', 'a.b.x', 'a.b.d', 'q.r.s']
    """
    shared = [_shared(name, other) for other in others]
    count = Counter(shared)
    keys = [
        (s, _likeness(name, other) if count[s] > 1 else 0.0)
        for s, other in zip(shared, others, strict=True)
    ]
    order = sorted(range(len(others)), key=keys.__getitem__, reverse=True)
    return [others[i] for i in order]


def pair_renames(unused: Sequence[Named], missing: Sequence[Named]) -> dict[str, str]:
    """Missing tensor -> the unused key that most likely is it (same element count; names
    sharing the most components, then the same shape, then the most alike names). One key per
    tensor, one tensor per key.

    Example:
        >>> key = Named("bert.pooler.weight", "bert.pooler.weight", 4)
        >>> tensors = [Named("pooler.weight", "pooler.weight", 4), Named("pooler.bias", "b", 2)]
        >>> pair_renames([key], tensors)
        {'pooler.weight': 'bert.pooler.weight'}
    """
    index = NameIndex(missing)
    scored: list[tuple[int, bool, float, int, int]] = []
    for u, key in enumerate(unused):
        for m in index.candidates(key.name, key.numel):
            shared, ratio = _score(key.name, missing[m].name)
            if shared or ratio >= 0.6:
                scored.append((shared, key.shape == missing[m].shape, ratio, u, m))
    scored.sort(key=lambda s: (-s[0], -s[1], -s[2], s[3], s[4]))
    pairs: dict[str, str] = {}
    taken: set[int] = set()
    for *_, u, m in scored:
        param = missing[m].ident
        if param not in pairs and u not in taken:
            pairs[param] = unused[u].ident
            taken.add(u)
    return pairs


class Nearest:
    """Nearest existing names for names the model does not have, in time linear in the names.

    Candidates come from shared blocking keys; a name with none is compared with every name only
    while the whole search stays under ``FULL_SCAN`` comparisons (``shortened`` says how many
    names went without that scan).
    """

    def __init__(self, names: Sequence[str], lookups: int) -> None:
        self.names = list(dict.fromkeys(names))
        self.index = NameIndex(Named(n, n, None) for n in self.names)
        self.full_scan = lookups * len(self.names) <= FULL_SCAN
        self.shortened = 0

    def __call__(self, name: str, n: int = 3) -> list[str]:
        if not self.names:  # a model without tensors: nothing is near
            return []
        found = [self.names[i] for i in self.index.candidates(name, None)]
        if found:
            return _ranked(name, found)[:n]
        if not self.full_scan:
            self.shortened += 1
            return []
        return difflib.get_close_matches(name, self.names, n=n, cutoff=0.4)
