"""One colour per fate of a checkpoint key or a model tensor, the same in every notebook.

Only the fates that keep a checkpoint from loading get warning colours (orange, red, raspberry,
amber, purple); a key that loaded, or was set aside on purpose by a rule, gets a quiet one,
unless the tensor it would have filled is then missing (purple: the cause of that problem). Plotly's
default colour sequence is never used for fates: it paints whatever comes first red (once
``lm_head``, which read as an error).
"""

from __future__ import annotations

from loadkit.terms import Status

MISSING = "missing"  # a model tensor no key filled ("never filled" in the report)
# A key a rule set aside on purpose (dropped, skipped, ignored) whose own tensor is then missing:
# the cause of a missing tensor, not a quiet fate (GPT-2's attention biases under vLLM's rules).
LEFT_OUT = "left out, its tensor missing"
NOT_CHECKED = "header only"  # no model given: the key's fate is not known

FATE_COLOURS: dict[str, str] = {
    Status.LOADED: "#5f9e8f",
    Status.DELEGATED: "#86b9ac",
    Status.SKIPPED: "#a9b4bf",
    Status.IGNORED: "#c4cbd3",
    Status.MAPPER_DROPPED: "#8a96a8",
    NOT_CHECKED: "#9db4cc",
    Status.UNEXPECTED: "#f08c00",
    Status.SHAPE_MISMATCH: "#d62828",
    Status.LOAD_ERROR: "#7b0d1e",
    Status.UNCONSUMED: "#e9b000",
    LEFT_OUT: "#8e44ad",
    MISSING: "#c2185b",
}
PROBLEMS = (
    Status.UNEXPECTED,
    Status.SHAPE_MISMATCH,
    Status.LOAD_ERROR,
    Status.UNCONSUMED,
    LEFT_OUT,
    MISSING,
)
# What each fate means, for a legend.
FATE_WORDS: dict[str, str] = {
    Status.LOADED: "loaded",
    Status.DELEGATED: "handed to a child's load_weights",
    Status.SKIPPED: "skipped by a skip rule",
    Status.IGNORED: "ignored by an ignore rule",
    Status.MAPPER_DROPPED: "dropped by the mapper",
    NOT_CHECKED: "not checked: no load simulated",
    Status.UNEXPECTED: "unexpected: the model has no such name",
    Status.SHAPE_MISMATCH: "shape mismatch",
    Status.LOAD_ERROR: "load error",
    Status.UNCONSUMED: "unconsumed: no loader took it",
    LEFT_OUT: "set aside by a rule, yet its tensor is missing",
    MISSING: "missing: a model tensor no key filled",
}
BRANCH = "#f1f3f5"  # a box of several keys with no problem among them
INDEX_OUTLINE = "#343a40"  # the border of a key an index problem names


def is_problem(fate: str) -> bool:
    """Does ``fate`` keep the checkpoint from loading?

    >>> is_problem("loaded"), is_problem("shape mismatch"), is_problem("missing")
    (False, True, True)
    """
    return fate in PROBLEMS


def tint(colour: str, share: float = 0.22) -> str:
    """``colour`` (``#rrggbb``) mixed with white, ``share`` of it kept: a box that holds a
    problem somewhere inside, lighter than the problem's own box.

    >>> tint("#d62828", 0.5)
    '#ea9494'
    """
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(255 - share * (255 - c)) for c in rgb]
    return "#" + "".join(f"{c:02x}" for c in mixed)


def worst(fates: list[str]) -> str | None:
    """The first of ``PROBLEMS`` among ``fates`` (None if there is none).

    >>> worst(["loaded", "missing", "unexpected"])
    'unexpected'
    """
    return next((p for p in PROBLEMS if p in fates), None)
