"""The prefix tree of a checkpoint's key names, with tensor counts, bytes and dtypes per node.

Checkpoint names are dotted paths (``model.layers.3.self_attn.q_proj.weight``); the tree splits
them at the dots so a layout reads like the module tree it was saved from. Folding merges
numbered siblings (``layers.0`` ... ``layers.27``) into one node ``layers.{0-27}`` with the sums
of all of them: a 2000-name checkpoint then reads in a screenful, and a gap (``{0-4,6-27}``) or a
count that is not a multiple of the instances shows a missing layer or tensor at a glance. Each
tensor node of a folded tree knows its siblings: the shape most of them have, the ones that differ
(``[8, 16] in encoder.layer.3``) and the instances that lack it (``missing in encoder.layer.4``).

Torch-free and built in one pass over the names (counted per node, then summed bottom-up): the
header-only inspector builds it for checkpoints of any size. Any name fits: a name of more than
``MAX_DEPTH`` components keeps its tail as one node, a component of more than 18 digits is not
folded, and a folded label that a literal component already spells (``{0}``) gets a ``'``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from loadkit.errors import LoadkitError, printable
from loadkit.fmt import format_bytes, plural
from loadkit_inspect.report.text import capped, joined_names

_NUMBERED = object()  # the key numbered siblings share while a folded tree is built
MAX_DEPTH = 64  # components; the rest of a longer name stays one node (the walks recurse)
_MAX_INDEX_DIGITS = 18  # a longer number is a name, not an index (int() refuses 4300+ digits)


class LayoutNode:
    """One dotted prefix: every tensor at or below it is counted here.

    Slotted: a checkpoint of thousands of names has a node for each dotted prefix.
    """

    __slots__ = (
        "_dtypes",
        "_folds",
        "_indices",
        "_missing_in",
        "_only_in",
        "_shapes",
        "_universe",
        "_variants",
        "children",
        "dtypes",
        "instances",
        "is_tensor",
        "name",
        "nbytes",
        "of",
        "own",
        "path",
        "shape",
        "tensors",
    )

    def __init__(self, name: str, path: str = "") -> None:
        self.name = name  # this component ("q_proj"), a folded label ("{0-27}"); "" for the root
        self.path = path  # the full dotted prefix; "" for the root
        self.tensors = 0  # tensors at or below
        self.nbytes = 0
        self.dtypes: dict[str, int] = {}  # dtype -> tensors at or below
        self.children: dict[Any, LayoutNode] = {}  # by name; by _NUMBERED while folding
        self.is_tensor = False  # a tensor's name ends exactly here
        self.instances = 1  # how many numbered siblings a folded node stands for
        self.own: tuple[int, int, str] | None = None  # (tensors, bytes, dtype) ending right here
        self.shape: tuple[int, ...] | None = None  # a tensor's shape (most instances' if folded)
        # Few nodes have these (see the properties): a list for each node would cost more
        # than the rest of a large tree's build.
        self._variants: list[Variant] | None = None
        self._missing_in: list[str] | None = None
        self._only_in: list[str] | None = None
        self.of = 0  # a folded tensor: the instances of its innermost fold
        self._universe: set[tuple[int, ...]] | None = None  # a folded node: instances below it
        # While building a tensor node of more than one tensor (a folded one, or a name given
        # twice): each one's shape, dtype and (folded) numbers, and the folded nodes above it.
        self._shapes: list[tuple[int, ...] | None] | None = None
        self._dtypes: list[str] | None = None
        self._indices: list[tuple[int, ...]] | None = None
        self._folds: tuple[LayoutNode, ...] = ()

    @property
    def variants(self) -> list[Variant]:
        """A folded tensor's instances whose shape or dtype differ from the others'."""
        return self._variants or []

    @property
    def missing_in(self) -> list[str]:
        """A folded tensor's instances that lack it (``["encoder.layer.4"]``)."""
        return self._missing_in or []

    @property
    def only_in(self) -> list[str]:
        """... or, when most instances lack it, the few that have it."""
        return self._only_in or []

    def __repr__(self) -> str:
        return (
            f"LayoutNode({self.path or '(root)'!r}, tensors={self.tensors}, "
            f"nbytes={self.nbytes}, children={len(self.children)})"
        )

    def walk(self) -> Iterator[LayoutNode]:
        """This node and every node below it, depth first, in the order names first appear."""
        yield self
        for child in self.children.values():
            yield from child.walk()

    def find(self, path: str) -> LayoutNode | None:
        """The node at ``path`` (folded labels included, e.g. ``"layers.{0-27}"``)."""
        node = self
        for part in path.split(".", MAX_DEPTH - 1) if path else ():
            found = node.children.get(part)
            if found is None:
                return None
            node = found
        return node

    def leaves(self) -> Iterator[tuple[str, int, str]]:
        """``(name, nbytes, dtype)`` of each tensor, in tree order (an unfolded tree's only)."""
        for node in self.walk():
            if node.own is not None:
                count, nbytes, dtype = node.own
                if count != 1:
                    raise LoadkitError(f"{node.path!r} stands for {count} tensors: a folded tree")
                yield node.path, nbytes, dtype

    def folded(self) -> LayoutNode:
        """The same tensors with numbered siblings merged (see the module docstring)."""
        shapes = {n.path: n.shape for n in self.walk() if n.own is not None}
        return build_layout(((*t, shapes[t[0]]) for t in self.leaves()), fold=True)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "path": self.path,
            "tensors": self.tensors,
            "bytes": self.nbytes,
            "dtypes": dict(sorted(self.dtypes.items())),
        }
        if self.is_tensor:
            d["is_tensor"] = True
        if self.instances != 1:
            d["instances"] = self.instances
        if self.shape is not None:
            d["shape"] = list(self.shape)
        if self.variants:
            d["variants"] = [v.as_dict() for v in self.variants]
        if self.missing_in:
            d["missing_in"] = self.missing_in
        if self.only_in:
            d["only_in"] = self.only_in
            d["of"] = self.of
        if self.children:
            d["children"] = [c.as_dict() for c in self.children.values()]
        return d

    def render(self, *, max_children: int = 40, max_depth: int | None = None) -> str:
        """An indented text tree. Single-child chains are joined (``embed_tokens.weight``)."""
        rows: list[tuple[int, str, LayoutNode | None]] = []
        _child_rows(self, 0, rows, max_children, max_depth)
        width = max((2 * d + len(label) for d, label, _ in rows), default=0)
        counts = {id(node): _count(node) for _, _, node in rows if node is not None}
        words = max((len(w) for _, w in counts.values()), default=0)
        lines = []
        for depth, label, node in rows:
            if node is None:  # an elision row
                lines.append("  " * depth + label)
                continue
            text = ("  " * depth + label).ljust(width)
            dt = ", ".join(f"{k} {v}" for k, v in sorted(node.dtypes.items()))
            n, what = counts[id(node)]
            shape = f"  {node.shape_text()}" if node.is_tensor else ""
            lines.append(
                f"{text}  {n:>6} {what:<{words}} {format_bytes(node.nbytes):>10}  {dt}" + shape
            )
        return "\n".join(lines)

    def shape_text(self) -> str:
        """``[16, 8]``; for a folded tensor also the instances that differ or lack it."""
        parts = [_shape(self.shape)] if self.shape is not None or not self.variants else []
        parts += [v.text() for v in self.variants]
        if self.missing_in:
            have = self.tensors
            parts.append(
                f"{have} of {have + len(self.missing_in)}: missing in {_places(self.missing_in)}"
            )
        if self.only_in:
            parts.append(f"{self.tensors} of {self.of}: only in {_places(self.only_in)}")
        return "; ".join(p for p in parts if p)

    def odd_ones(self) -> Iterator[LayoutNode]:
        """Folded tensor nodes whose instances differ in shape or dtype, or where one lacks it."""
        for node in self.walk():
            if node._variants or node._missing_in or node._only_in:
                yield node

    def section(self, limit: int, max_depth: int | None = None) -> list[str]:
        """The report's layout section for this (folded) tree: the folded siblings that differ,
        capped at ``limit`` rows, then the tree down to ``max_depth``."""
        lines = ["layout  (numbered siblings folded into {a-b})"]
        odd = list(self.odd_ones())
        if odd:
            lines.append(f"  folded siblings that differ ({len(odd)}):")
            rows = [f"    {printable(n.path)}: {_odd(n)}" for n in odd]
            lines += capped(rows, len(rows), limit)
        tree = self.render(max_depth=max_depth)
        return lines + ["  " + row for row in tree.splitlines()]


class Variant:
    """Folded instances of one tensor that differ from the others' shape or dtype."""

    __slots__ = ("dtype", "places", "shape", "usual")

    def __init__(
        self, shape: tuple[int, ...] | None, dtype: str | None, places: list[str], usual: str
    ) -> None:
        self.shape = shape  # None: the same shape as the others
        self.dtype = dtype  # None: the same dtype as the others
        self.places = places
        self.usual = usual  # what the others have, where this one differs ("[16, 8] F32")

    def text(self, *, usual: bool = False) -> str:
        what = " ".join(x for x in (_shape(self.shape), self.dtype or "") if x)
        return f"{what} in {_places(self.places)}" + (f" (the others {self.usual})" * usual)

    def as_dict(self) -> dict[str, Any]:
        return {
            "shape": None if self.shape is None else list(self.shape),
            "dtype": self.dtype,
            "in": self.places,
        }


def _odd(node: LayoutNode) -> str:
    parts = [v.text(usual=True) for v in node.variants]
    if node.missing_in:
        parts.append(f"missing in {joined_names(node.missing_in)}")
    if node.only_in:
        parts.append(f"only in {joined_names(node.only_in)} (of {node.of})")
    return "; ".join(parts)


def _shape(shape: tuple[int, ...] | None) -> str:
    return "" if shape is None else str(list(shape))


def _places(places: list[str], limit: int = 4) -> str:
    shown = ", ".join(places[:limit])
    return shown + (f" (and {len(places) - limit} more)" if len(places) > limit else "")


_LAYERS = ("layer", "layers", "h", "block", "blocks")


def _count(node: LayoutNode) -> tuple[int, str]:
    """The count column: ``(96, "tensors")``, or for a fold ``(6, "layers x 16 tensors")``
    (``"6 layers, 95 tensors"`` when the instances do not hold alike many)."""
    if node.instances <= 1:
        return node.tensors, "tensor" if node.tensors == 1 else "tensors"
    head = node.path.rpartition("{")[0].rstrip(".").rpartition(".")[2]  # layer.{0-5}: layer
    noun = "layers" if head in _LAYERS else (head if head.endswith("s") else "instances")
    per, rest = divmod(node.tensors, node.instances)
    if rest:
        return node.instances, f"{noun}, {node.tensors} tensors in all"
    return node.instances, f"{noun} x {plural(per, 'tensor')}"


def _rows(
    node: LayoutNode,
    depth: int,
    head: str,
    rows: list[tuple[int, str, LayoutNode | None]],
    max_children: int,
    max_depth: int | None,
) -> None:
    name = printable(node.name)  # a control character in a name stays on its row
    label = f"{head}.{name}" if head else name
    # A chain of single children reads better as one row: "embed_tokens.weight".
    if len(node.children) == 1 and not node.is_tensor and node.instances == 1:
        child = next(iter(node.children.values()))
        _rows(child, depth, label, rows, max_children, max_depth)
        return
    rows.append((depth, label, node))
    if max_depth is None or depth + 1 < max_depth:
        _child_rows(node, depth + 1, rows, max_children, max_depth)


def _child_rows(
    node: LayoutNode,
    depth: int,
    rows: list[tuple[int, str, LayoutNode | None]],
    max_children: int,
    max_depth: int | None,
) -> None:
    children = list(node.children.values())
    for child in children[:max_children]:
        _rows(child, depth, "", rows, max_children, max_depth)
    if len(children) > max_children:
        rows.append((depth, f"... {len(children) - max_children} more", None))


def _ranges(indices: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``'0-2,5,7-8'``."""
    parts: list[str] = []
    ordered = sorted(indices)
    start = prev = ordered[0]
    for i in [*ordered[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


# Where a walk down the tree stands: the node, the numbers folded on the way down, and the folded
# nodes they were folded into.
_At = tuple[LayoutNode, tuple[int, ...], tuple[LayoutNode, ...]]


def _step(at: _At, part: str, fold: bool) -> _At:
    """One component further down, creating the child (or, folding, the numbered one)."""
    node, index, folds = at
    numbered = fold and part.isdigit() and part.isascii() and len(part) <= _MAX_INDEX_DIGITS
    key = _NUMBERED if numbered else part
    child = node.children.get(key)
    if child is None:
        child = node.children[key] = LayoutNode("" if numbered else part)
        if numbered:
            child._universe = set()
    if not numbered:
        return child, index, folds
    return child, (*index, int(part)), (*folds, child)


def _walk(prefixes: dict[str, _At], prefix: str, top: _At, fold: bool) -> _At:
    """Where the dotted ``prefix`` (not walked yet) ends: one step below its own prefix, walked
    first if it was not either. Remembered."""
    up, dot, last = prefix.rpartition(".")
    at = prefixes.get(up) if dot else top
    if at is None:
        at = _walk(prefixes, up, top, fold)
    at = prefixes[prefix] = _step(at, last, fold)
    return at


def _walk_long(name: str, top: _At, fold: bool) -> _At:
    """Where a name of more than ``MAX_DEPTH`` components ends: its tail stays one component.
    Walked, not remembered: its last node stands for more than one component."""
    at = top
    for part in name.split(".", MAX_DEPTH - 1):
        at = _step(at, part, fold)
    return at


def build_layout(items: Iterable[tuple[Any, ...]], *, fold: bool = False) -> LayoutNode:
    """The tree of ``(name, nbytes, dtype)`` or ``(name, nbytes, dtype, shape)`` items, children
    in the order names first appear.

    ``fold=True`` merges numbered siblings as it builds (see the module docstring).
    """
    root = LayoutNode("")
    kept = _add(root, items, fold)
    for node in kept:
        _count_instances(node)
    _finish(root, "", root=True)  # ... and each node's counts are summed into those above it
    for node in kept:
        _describe(node)
    return root


def _add(root: LayoutNode, items: Iterable[tuple[Any, ...]], fold: bool) -> list[LayoutNode]:
    """Count each item at the node its name ends at, creating the nodes on its way. The tensor
    nodes of more than one tensor, or below a fold, keep each one's shape, dtype and numbers
    for later: those are returned.

    Names share their heads (``model.layers.3.mlp``): each dotted prefix above a tensor's
    parent is walked once and remembered. The parent itself is looked up from its own parent:
    most parents hold a tensor or two, so remembering each would cost more than it saves.
    """
    top: _At = (root, (), ())
    prefixes: dict[str, _At] = {}
    kept: list[LayoutNode] = []
    for item in items:
        if len(item) == 4:
            name, nbytes, dtype, shape = item
        else:  # (name, nbytes, dtype)
            name, nbytes, dtype, *rest = item
            shape = rest[0] if rest else None
        shape = None if shape is None else tuple(shape)
        head, dot, last = name.rpartition(".")
        at: _At | None = top
        if dot and name.count(".") >= MAX_DEPTH:  # a longer name
            at = None
        elif dot:
            up, sep, mid = head.rpartition(".")
            above = (prefixes.get(up) or _walk(prefixes, up, top, fold)) if sep else top
            parent = above[0].children.get(mid)  # None for a numbered one while folding
            if parent is not None:
                at = (parent, above[1], above[2])
            else:
                at = prefixes.get(head) or _walk(prefixes, head, top, fold)
        if at is None:
            node, index, folds = _walk_long(name, top, fold)
        else:
            seen = at[0].children.get(last)  # None for a numbered one while folding
            if seen is not None and seen.is_tensor:  # a tensor node met before
                node, index = seen, at[1]
            else:
                node, index, folds = _step(at, last, fold)
        if not node.is_tensor:  # the first name to end here (most nodes end one)
            _first_tensor(node, nbytes, dtype, shape, index, folds)
            if folds:
                kept.append(node)
            continue
        # One more instance of a folded tensor (or, unfolded, a name given again).
        node.nbytes += nbytes
        shapes, dtypes = node._shapes, node._dtypes
        if shapes is None or dtypes is None:  # unfolded: keep the one so far, and this one
            shapes, dtypes = node._shapes, node._dtypes = [node.shape], [*node.dtypes]
            kept.append(node)
        shapes.append(shape)
        dtypes.append(dtype)
        if node._indices is not None:
            node._indices.append(index)
    return kept


def _first_tensor(
    node: LayoutNode,
    nbytes: int,
    dtype: str,
    shape: tuple[int, ...] | None,
    index: tuple[int, ...],
    folds: tuple[LayoutNode, ...],
) -> None:
    """Count the first tensor whose name ends at ``node``."""
    node.is_tensor = True
    node.tensors, node.nbytes, node.dtypes = 1, nbytes, {dtype: 1}
    node.own, node.shape = (1, nbytes, dtype), shape
    if folds:  # its instances are kept, to tell those that differ or lack it
        node._shapes, node._dtypes, node._indices, node._folds = [shape], [dtype], [index], folds


def _count_instances(node: LayoutNode) -> None:
    """A kept tensor node's own counts by dtype, and the instances of the folds above it that
    hold one of its tensors (they name the folds: ``{0-2,4}``)."""
    dtypes = node._dtypes or []
    node.tensors = len(dtypes)
    node.dtypes = _counts(dtypes)
    node.own = (node.tensors, node.nbytes, dtypes[-1])
    index = node._indices or []
    for depth, folded in enumerate(node._folds, 1):
        if folded._universe is not None:  # always, for a folded node
            folded._universe.update(
                index if depth == len(node._folds) else {i[:depth] for i in index}
            )


def _describe(node: LayoutNode) -> None:
    """Set a kept tensor node's shape, and for a folded one the instances that differ or lack it."""
    shapes, dtypes = node._shapes or [], node._dtypes or []
    index, folds = node._indices, node._folds
    node._shapes = node._dtypes = node._indices = None
    node._folds = ()
    n = len(shapes)
    alike = shapes.count(shapes[0]) == n and dtypes.count(dtypes[0]) == n  # most are
    if alike:
        shape, dtype = shapes[0], dtypes[0]
    else:
        shape, dtype = _most_common(Counter(zip(shapes, dtypes, strict=True)))
    node.shape = shape
    if not folds or index is None:  # a name given more than once
        return
    odd: dict[tuple[tuple[int, ...] | None, str], list[str]] = {}
    if not alike:
        for i, s, d in zip(index, shapes, dtypes, strict=True):
            if s != shape or d != dtype:
                odd.setdefault((s, d), []).append(_place(folds, i))
    variants = []
    for (s, d), places in odd.items():
        usual = [_shape(shape)] if s != shape else []
        usual += [dtype] if d != dtype else []
        variants.append(
            Variant(s if s != shape else None, d if d != dtype else None, places, " ".join(usual))
        )
    node._variants = variants or None
    present = set(index)
    universe = folds[-1]._universe or set()
    node.of = len(universe)
    # Name the smaller side, so the work stays linear in the tensors: the few instances that
    # lack the tensor, or (for a tensor most lack, like one extra key per layer) the few that
    # have it.
    if len(present) == len(universe):  # in every instance
        return
    if 2 * len(present) >= len(universe):
        node._missing_in = [_place(folds, i) for i in sorted(universe - present)]
    else:
        node._only_in = [_place(folds, i) for i in sorted(present)]


def _counts(values: list[str]) -> dict[str, int]:
    """``{value: how many}``, in the order first met (at C speed when all are alike)."""
    first = values[0]
    return {first: len(values)} if values.count(first) == len(values) else dict(Counter(values))


def _most_common(counts: Counter[tuple[tuple[int, ...] | None, str]]) -> tuple[Any, str]:
    """The first of the most common ``(shape, dtype)`` (a Counter keeps the order it met them)."""
    return max(counts, key=counts.__getitem__)


def _place(folds: Sequence[LayoutNode], index: tuple[int, ...]) -> str:
    """The instance ``index`` of the innermost folded node, spelled out: ``layers.3``."""
    parts = folds[-1].path.split(".")
    positions = [len(f.path.split(".")) - 1 for f in folds]
    for pos, i in zip(positions, index, strict=False):
        parts[pos] = str(i)
    return ".".join(parts)


def _finish(node: LayoutNode, path: str, root: bool = False) -> None:
    """Set the paths and folded labels below ``node``, and sum its children's counts into it."""
    node.path = path
    if _NUMBERED in node.children:  # a numbered child: label it (by name from here on)
        node.children = _labelled(node.children)
    tensors, nbytes, dtypes = node.tensors, node.nbytes, node.dtypes
    for child in node.children.values():
        child_path = child.name if root else f"{path}.{child.name}"  # ".a": "" then ".a"
        if child.children:
            _finish(child, child_path)
        else:  # most nodes are leaves
            child.path = child_path
        tensors += child.tensors
        nbytes += child.nbytes
        for dtype, n in child.dtypes.items():
            dtypes[dtype] = dtypes.get(dtype, 0) + n
    node.tensors, node.nbytes = tensors, nbytes


def _labelled(children: dict[Any, LayoutNode]) -> dict[str, LayoutNode]:
    """``children`` by name, the numbered one named for its numbers (``{0-27}``)."""
    named: dict[str, LayoutNode] = {}
    for child in children.values():
        if child._universe is not None:
            numbers = {index[-1] for index in child._universe}
            child.name = "{" + _ranges(numbers) + "}"
            child.instances = len(numbers)
        while child.name in named:  # a literal "{0}" next to a folded {0}: keep both
            child.name += "'"
        named[child.name] = child
    return named


def treemap_columns(root: LayoutNode) -> dict[str, list[Any]]:
    """``ids``, ``labels``, ``parents``, ``values`` (bytes), ``tensors``: plotly treemap columns.

    Values are totals per node (use ``branchvalues="total"``); the root is the checkpoint itself.
    """
    cols: dict[str, list[Any]] = {"ids": [], "labels": [], "parents": [], "values": []}
    cols["tensors"] = []
    top = "(checkpoint)"

    def visit(node: LayoutNode, node_id: str, parent_id: str) -> None:
        cols["ids"].append(node_id)
        cols["labels"].append(node.name or top)
        cols["parents"].append(parent_id)
        cols["values"].append(node.nbytes)
        cols["tensors"].append(node.tensors)
        for child in node.children.values():
            # Ids hang off the parent's id, so no name (not even an empty component) collides.
            visit(child, f"{node_id}/{child.name}", node_id)

    visit(root, top, "")
    return cols
