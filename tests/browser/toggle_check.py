"""What the chart must show for each behaviour, and the check that the page shows it.

The expectation is computed by the library, from the story's records, with the same figure
builder the notebook's toggle calls: the page must draw exactly those traces.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loadkit_notebooks.scenario import Record
from loadkit_notebooks.viz import figure

if TYPE_CHECKING:  # lab_page imports playwright: the helpers here must import without it
    from lab_page import NotebookPage

Build = Callable[[Record], Any]


def _plain(value: Any) -> Any:
    """One value as the page reports it: plain numbers, NaN as None, floats to 12 digits."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple, str)):
        value = value.item()  # numpy / torch scalars
    if isinstance(value, float):
        return None if math.isnan(value) else float(f"{value:.12g}")
    return value


def _trace(t: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": t.get("name"),
        "type": t.get("type") or "scatter",
        "mode": t.get("mode"),
        "x": [_flat(v) for v in t.get("x") or ()],
        "y": [_flat(v) for v in t.get("y") or ()],
        "z": [_flat(v) for v in t.get("z") or ()],
    }


def _flat(value: Any) -> Any:
    if isinstance(value, (list, tuple)) or (
        hasattr(value, "tolist") and not hasattr(value, "item")
    ):
        return [_flat(v) for v in value]
    return _plain(value)


def expected_traces(record: Record, build: Build = figure) -> list[dict[str, Any]]:
    """The traces ``build`` draws for ``record`` (computed without any widget)."""
    fig = build(record)
    return [
        _trace(
            {
                "name": t.name,
                "type": t.type,
                "mode": getattr(t, "mode", None),
                "x": list(t.x if t.x is not None else ()),
                "y": list(t.y if t.y is not None else ()),
                "z": list(getattr(t, "z", None) if getattr(t, "z", None) is not None else ()),
            }
        )
        for t in fig.data
    ]


def page_traces(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [_trace(t) for t in state["traces"]]


def title_shows(title: str, behaviour: str) -> bool:
    """``loadkit_notebooks.viz`` titles a chart ``"<title> [<behaviour>]"``, or the behaviour."""
    return title == behaviour or title.endswith(f" [{behaviour}]")


_MISSING = object()


def _preview(values: list[Any], start: int, n: int = 6) -> str:
    """``n`` values from index ``start`` on, and how many there are in all."""
    part = ", ".join(repr(v) for v in values[start : start + n])
    more = ", ..." if len(values) > start + n else ""
    return f"[{'..., ' if start else ''}{part}{more}] ({len(values)} points)"


def describe_difference(shown: list[dict[str, Any]], expected: list[dict[str, Any]]) -> str:
    """Where the page's traces part from the library's, trace by trace, in a few lines."""
    names = ([t["name"] for t in shown], [t["name"] for t in expected])
    if names[0] != names[1]:
        return f"    page traces {names[0]}, library traces {names[1]}"
    lines = []
    for page, lib in zip(shown, expected, strict=True):
        for key in ("type", "mode", "x", "y", "z"):
            if page[key] == lib[key]:
                continue
            if key in ("type", "mode"):
                lines.append(f"    {page['name']!r}: {key} {page[key]!r}, library {lib[key]!r}")
                continue
            pairs = itertools.zip_longest(page[key], lib[key], fillvalue=_MISSING)
            diff = [i for i, (a, b) in enumerate(pairs) if a != b]
            lines.append(
                f"    {page['name']!r}: {key} differs at {len(diff)} of {len(lib[key])} points"
                f" (first at index {diff[0]})\n"
                f"      page    {_preview(page[key], diff[0])}\n"
                f"      library {_preview(lib[key], diff[0])}"
            )
    return "\n".join(lines) or "    traces equal (only the title differs)"


def click_order(options: list[str], active: str | None = None) -> list[str]:
    """Every option, then the first clicked again, starting after the one pressed: every click
    changes the toggle (``new, old, new`` from ``old``), so each chart the page shows was drawn
    by the toggle's callback, not left over from the page's first render."""
    start = (options.index(active) + 1) % len(options) if active in options else 0
    order = options[start:] + options[:start]
    return [*order, order[0]]


def assert_toggle_drives_chart(
    page: NotebookPage, records: dict[str, Record], build: Build = figure, timeout: float = 10.0
) -> list[str]:
    """Click each option of the page's main toggle; the chart after it must become ``build`` of
    that option's record.

    Returns the options clicked, in order.
    """
    options = list(records)
    labels = page.toggle_labels()
    assert labels == options, (
        f"the first toggle in the page offers {labels}, the story's main_records() {options}"
    )
    expected = {b: expected_traces(r, build) for b, r in records.items()}
    clicked = click_order(options, page.active_label())
    for behaviour in clicked:
        page.click_toggle(behaviour)
        deadline = time.monotonic() + timeout
        while True:
            state = page.chart_state()
            shown = page_traces(state)
            if shown == expected[behaviour] and title_shows(state["title"], behaviour):
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"after clicking {behaviour!r} on the main toggle, the chart after it "
                    f"did not follow within {timeout:g} s.\n"
                    f"  page title: {state['title']!r} (expected it to end in [{behaviour}])\n"
                    f"  page traces against the library's for records[{behaviour!r}]:\n"
                    + describe_difference(shown, expected[behaviour])
                )
            time.sleep(0.1)
    return clicked
