"""The load rules a user adds to an inspect: ``LoadRules`` (rules for the model's root
AutoWeightsLoader, and verdict rules), and ``pattern_problem`` (why a shell-style pattern would
match nothing). Torch-free.
"""

from __future__ import annotations

from typing import NamedTuple


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is no shell-style pattern, or ``None``: a ``[`` that opens a character
    class never closed. ``fnmatch`` would take that ``[`` literally, and model tensor names have
    none: the pattern would quietly match nothing (``[[]`` is a literal ``[``).

    Example:
        >>> pattern_problem("layers.[0-3].*") is None, pattern_problem("layers.[0-3.*")
        (True, "'[' at 7 opens a character class never closed (a literal '[' is '[[]')")
    """
    i = pattern.find("[")
    while i >= 0:
        j = i + 1  # fnmatch's reading: a leading '!' negates, a leading ']' is a member
        if pattern.startswith("!", j):
            j += 1
        if pattern.startswith("]", j):
            j += 1
        end = pattern.find("]", j)
        if end < 0:
            return f"'[' at {i} opens a character class never closed (a literal '[' is '[[]')"
        i = pattern.find("[", end + 1)
    return None


class LoadRules(NamedTuple):
    """Extra rules, as if the model's root ``AutoWeightsLoader`` had been built with them
    (``skip_prefixes``, ``ignore_unexpected_prefixes``, ``ignore_unexpected_suffixes``), and
    two rules for the verdict: tensors that may stay unfilled, and whether any dtype cast fails.

    Example:
        >>> rules = LoadRules(allow_missing=("classifier.*",))
        >>> rules.allowed("classifier.weight"), rules.allowed("bert.pooler.weight")
        ('classifier.*', None)
    """

    skip_prefixes: tuple[str, ...] = ()
    ignore_unexpected_prefixes: tuple[str, ...] = ()
    ignore_unexpected_suffixes: tuple[str, ...] = ()
    # shell-style patterns (fnmatch) over missing model tensors' names, either spelling
    allow_missing: tuple[str, ...] = ()
    strict_dtype: bool = False  # any cast fails the load, not only incompatible ones

    @property
    def for_auto_loader(self) -> bool:
        """Are there rules for the root AutoWeightsLoader (not only for the verdict)?"""
        return bool(
            self.skip_prefixes or self.ignore_unexpected_prefixes or self.ignore_unexpected_suffixes
        )

    def allowed(self, *names: str) -> str | None:
        """The first ``allow_missing`` pattern one of ``names`` matches, if any: a model
        tensor's own name, then the checkpoint names it would have been loaded from."""
        import fnmatch

        for pattern in self.allow_missing:
            if any(fnmatch.fnmatchcase(name, pattern) for name in names):
                return pattern
        return None

    def skipped(self, key: str, mapped: str | None = None) -> str | None:
        """The rule by which ``skip_prefixes`` skips checkpoint key ``key``: by the name the
        mapper gave it (``mapped``), else by its own name; or ``None``.

        vLLM 0.29.0 dropped its loader's ``skip_prefixes``; this option does what a mapper
        rule to ``None`` would (``orig_to_new_prefix={"bert.pooler.": None}``), on either name.

        >>> rules = LoadRules(skip_prefixes=("bert.pooler.",))
        >>> rules.skipped("bert.pooler.dense.bias"), rules.skipped("p.x", "bert.pooler.x")
        ("skip_prefixes 'bert.pooler.' (checkpoint name)", "skip_prefixes 'bert.pooler.'")
        """
        named = [(mapped, "")] if mapped is not None else []
        for name, said in [*named, (key, " (checkpoint name)")]:
            for p in self.skip_prefixes:
                if name.startswith(p):
                    return f"skip_prefixes {p!r}{said}"
        return None

    def ignored(self, key: str, *mapped: str | None) -> str | None:
        """The rule by which a key the model has no place for is ignored: its checkpoint name
        ``key``, else a name it was ``mapped`` to, starts with an ``ignore_unexpected_prefixes``
        prefix or ends with an ``ignore_unexpected_suffixes`` suffix; or ``None``.

        >>> rules = LoadRules(ignore_unexpected_prefixes=("model.cls.",))
        >>> rules.ignored("cls.extra.bias"), rules.ignored("cls.extra.bias", "model.cls.extra.bias")
        (None, "ignore_unexpected_prefixes 'model.cls.' (name after the mapper)")
        """
        if not (self.ignore_unexpected_prefixes or self.ignore_unexpected_suffixes):
            return None  # asked for each unexpected key: 200,000 of them cost nothing then
        spellings = [(key, "checkpoint name")]
        spellings += [(m, "name after the mapper") for m in dict.fromkeys(mapped) if m and m != key]
        for name, spelling in spellings:
            for p in self.ignore_unexpected_prefixes:
                if name.startswith(p):
                    return f"ignore_unexpected_prefixes {p!r} ({spelling})"
            for s in self.ignore_unexpected_suffixes:
                if name.endswith(s):
                    return f"ignore_unexpected_suffixes {s!r} ({spelling})"
        return None

    def as_dict(self) -> dict[str, object]:
        return {
            "skip_prefixes": list(self.skip_prefixes),
            "ignore_unexpected_prefixes": list(self.ignore_unexpected_prefixes),
            "ignore_unexpected_suffixes": list(self.ignore_unexpected_suffixes),
            "allow_missing": list(self.allow_missing),
            "strict_dtype": self.strict_dtype,
        }
