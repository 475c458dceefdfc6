"""The prefix tree of a checkpoint's key names, with tensor counts, bytes and dtypes per node.

Checkpoint names are dotted paths (``model.layers.3.self_attn.q_proj.weight``); the tree splits
them at the dots so a layout reads like the module tree it was saved from. ``folded()`` merges
numbered siblings (``layers.0`` ... ``layers.27``) into one node ``layers.{0-27}``: a 2000-name
checkpoint then reads in a screenful. Torch-free: the header-only inspector builds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


def fmt_bytes(n: int) -> str:
    """``1536`` -> ``'1.5 KiB'``: binary units, three significant figures."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass
class LayoutNode:
    """One dotted prefix: every tensor at or below it is counted here."""

    name: str  # this component ("q_proj"), or a folded label ("{0-27}"); "" for the root
    path: str  # the full dotted prefix; "" for the root
    tensors: int = 0
    nbytes: int = 0
    dtypes: dict[str, int] = field(default_factory=dict)  # dtype -> tensors below
    children: dict[str, LayoutNode] = field(default_factory=dict)
    is_tensor: bool = False  # a tensor's name ends exactly here
    instances: int = 1  # how many numbered siblings a folded node stands for

    def add(self, nbytes: int, dtype: str) -> None:
        self.tensors += 1
        self.nbytes += nbytes
        self.dtypes[dtype] = self.dtypes.get(dtype, 0) + 1

    def walk(self) -> Iterator[LayoutNode]:
        """This node and every node below it, depth first, in insertion order."""
        yield self
        for child in self.children.values():
            yield from child.walk()

    def find(self, path: str) -> LayoutNode | None:
        node = self
        for part in path.split(".") if path else ():
            node = node.children.get(part)
            if node is None:
                return None
        return node

    def folded(self) -> LayoutNode:
        """A copy in which numbered siblings are merged into one ``{a-b}`` node per run."""
        out = LayoutNode(
            self.name, self.path, self.tensors, self.nbytes, dict(self.dtypes), {},
            self.is_tensor, self.instances,
        )  # fmt: skip
        numbered = [c for k, c in self.children.items() if k.isdigit()]
        for key, child in self.children.items():
            if not key.isdigit():
                out.children[key] = child.folded()
        if numbered:
            indices = sorted(int(c.name) for c in numbered)
            label = "{" + _ranges(indices) + "}"
            merged = _merge(label, f"{self.path}.{label}" if self.path else label, numbered)
            out.children[label] = merged.folded()
        return out

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
        if self.children:
            d["children"] = [c.as_dict() for c in self.children.values()]
        return d

    def render(self, *, max_children: int = 40, max_depth: int | None = None) -> str:
        """An indented text tree. Single-child chains are joined (``embed_tokens.weight``)."""
        lines: list[str] = []
        rows: list[tuple[int, str, LayoutNode]] = []
        for child in self.children.values():
            _rows(child, 0, "", rows, max_children, max_depth)
        width = max((2 * d + len(label) for d, label, _ in rows), default=0)
        for depth, label, node in rows:
            if node is None:  # an elision row
                lines.append("  " * depth + label)
                continue
            text = ("  " * depth + label).ljust(width)
            times = f" x{node.instances}" if node.instances > 1 else ""
            dt = ", ".join(f"{k} {v}" for k, v in sorted(node.dtypes.items()))
            lines.append(
                f"{text}  {node.tensors:>6} tensors{times:<5} {fmt_bytes(node.nbytes):>10}  {dt}"
            )
        return "\n".join(lines)


def _rows(
    node: LayoutNode,
    depth: int,
    head: str,
    rows: list[Any],
    max_children: int,
    max_depth: int | None,
) -> None:
    label = f"{head}.{node.name}" if head else node.name
    # Join a chain of single children: "embed_tokens.weight" reads better as one row.
    if len(node.children) == 1 and not node.is_tensor:
        _rows(next(iter(node.children.values())), depth, label, rows, max_children, max_depth)
        return
    rows.append((depth, label, node))
    if max_depth is not None and depth + 1 >= max_depth:
        return
    children = list(node.children.values())
    for child in children[:max_children]:
        _rows(child, depth + 1, "", rows, max_children, max_depth)
    if len(children) > max_children:
        rows.append((depth + 1, f"... {len(children) - max_children} more", None))


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``'0-2,5,7-8'``."""
    parts: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def _merge(name: str, path: str, nodes: list[LayoutNode]) -> LayoutNode:
    """One node standing for ``nodes``: counts summed, children merged by name, recursively."""
    out = LayoutNode(name, path, instances=sum(n.instances for n in nodes))
    groups: dict[str, list[LayoutNode]] = {}
    for n in nodes:
        out.tensors += n.tensors
        out.nbytes += n.nbytes
        out.is_tensor |= n.is_tensor
        for k, v in n.dtypes.items():
            out.dtypes[k] = out.dtypes.get(k, 0) + v
        for key, child in n.children.items():
            groups.setdefault(key, []).append(child)
    for key, group in groups.items():
        merged = _merge(key, f"{path}.{key}", group)
        merged.instances = 1  # only the folded label itself says how many it stands for
        out.children[key] = merged
    return out


def build_layout(items: Iterable[tuple[str, int, str]]) -> LayoutNode:
    """The tree of ``(name, nbytes, dtype)`` triples, in the order names first appear."""
    root = LayoutNode("", "")
    for name, nbytes, dtype in items:
        root.add(nbytes, dtype)
        node = root
        path = ""
        for part in name.split("."):
            path = f"{path}.{part}" if path else part
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = LayoutNode(part, path)
            child.add(nbytes, dtype)
            node = child
        node.is_tensor = True
    return root


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
