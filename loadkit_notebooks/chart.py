"""A live plotly chart for notebooks, with a static picture for readers without a kernel.

``Chart`` is a small anywidget: the whole figure is one synced trait, so the frontend always
draws the latest figure (plotly's ``FigureWidget`` sends its data after the widget opens and
patches it by messages, and a view that renders in between stays blank), and it follows the
output's width. ``Panel`` lays widgets out above a chart; ``Picture`` is a figure's picture alone
(a later state of a live chart, kept where the story shows it). A chart or a panel displays as
one output whose mime bundle holds the live widget, a PNG of the chart as it was displayed (made
with kaleido when a Chromium is there) and one line of plain text: JupyterLab shows the widget, a
code host or nbviewer the picture, nbval compares the text.

plotly, ipywidgets, anywidget and kaleido are the ``notebooks`` extra: import this module only
from notebook code.
"""

from __future__ import annotations

import atexit
import base64
import html
import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as widgets
import plotly.graph_objects as go
import traitlets

# Static pictures: the width the notebook's output area has in JupyterLab at common window sizes.
IMAGE_WIDTH = 960
IMAGE_SCALE = 1
STATIC_IMAGES_ENV = "LOADKIT_STATIC_IMAGES"  # "0": never make pictures (faster, same text)


@cache
def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def spec_of(fig: go.Figure) -> dict[str, Any]:
    """The figure as plain JSON (``data`` and ``layout``), as the frontend receives it."""
    return json.loads(fig.to_json())


class Chart(anywidget.AnyWidget):
    """A plotly ``Figure`` shown live; ``draw(fig)`` replaces it.

    >>> chart = Chart(go.Figure(go.Bar(y=[1, 2])), text="two bars")
    >>> chart.draw(go.Figure(go.Bar(y=[2, 1])))
    >>> list(chart.fig.data[0].y)
    [2, 1]
    """

    _esm = Path(__file__).with_name("chart.js").read_text()
    spec = traitlets.Dict().tag(sync=True)
    _plotly_js = traitlets.Unicode().tag(sync=True)  # the frontend evaluates it once per page

    def __init__(self, fig: go.Figure, *, text: str = "", **kwargs: Any) -> None:
        self.fig = fig
        self.text = text
        # The figure goes into the widget's opening message: no view can render before it.
        super().__init__(spec=spec_of(fig), _plotly_js=_plotly_js(), **kwargs)

    def draw(self, fig: go.Figure) -> None:
        """Show ``fig`` in every view of this chart."""
        self.fig = fig
        self.spec = spec_of(fig)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return with_static(super()._repr_mimebundle_(**kwargs), self, self.text)


class Panel(widgets.VBox):
    """Widgets (toggles, sliders, charts) in a column; displayed with a picture of ``chart``."""

    def __init__(self, *children: Any, chart: Chart | None = None, text: str = "") -> None:
        super().__init__(children=list(children))
        self.chart = chart
        self.text = text

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        return with_static(super()._repr_mimebundle_(**kwargs), self.chart, self.text)


class Picture:
    """A figure's picture as it is now, with no live widget: a later state of a live chart,
    kept at its place in the story for every reader (JupyterLab, a code host, nbviewer). Its
    text is ``picture: <title>``; the PNG is there when one can be made (``static_png``).

    >>> Picture(go.Figure(layout={"title": "after the fix"})).text
    'picture: after the fix'
    """

    def __init__(self, fig: go.Figure) -> None:
        self.fig = fig
        self.text = "picture: " + (fig.layout.title.text or "")

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        return _with_picture({"text/plain": self.text}, self.fig)


def with_static(
    bundle: Any, chart: Chart | None, text: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``bundle`` (a widget's) with ``text`` as its plain text and, if one can be made, a PNG of
    ``chart`` for readers without a kernel, described by its alt text (in the output's metadata,
    where nbconvert and nbviewer read an image's ``alt``)."""
    data = dict(bundle[0] if isinstance(bundle, tuple) else bundle)
    data["text/plain"] = text or (chart_title(chart.fig) if chart else "")
    if chart is None:
        return data, {}
    return _with_picture(data, chart.fig)


def _with_picture(data: dict[str, Any], fig: go.Figure) -> tuple[dict[str, Any], dict[str, Any]]:
    png = static_png(fig)
    if png is None:
        return data, {}
    data["image/png"] = base64.b64encode(png).decode("ascii")
    return data, {"image/png": {"alt": alt_text(fig)}}


def chart_title(fig: go.Figure) -> str:
    title = fig.layout.title.text or ""
    return f"chart: {title}" if title else "chart"


# --- alt text ------------------------------------------------------------------------------------

_KINDS = {
    "bar": "bar chart",
    "heatmap": "heatmap",
    "scatter": "line chart",
    "sankey": "Sankey diagram",
}


def _plain(text: str | None) -> str:
    """A plotly label as plain words: tags and colour swatches dropped, line breaks as spaces."""
    words = html.unescape(re.sub(r"<[^>]+>", " ", text or "")).replace("\u25a0", " ")
    return " ".join(words.split())


def _flows(trace: Any, most: int = 12) -> str:
    """A Sankey trace's links as words, largest first."""
    label = [_plain(n) for n in trace.node.label or ()]
    link = trace.link
    ends = zip(link.value or (), link.source or (), link.target or (), strict=True)
    flows = sorted(ends, key=lambda f: -f[0])
    said = [f"{label[a]} to {label[b]} ({v:g})" for v, a, b in flows[:most]]
    more = f"; {len(flows) - most} more" if len(flows) > most else ""
    return " Flows: " + "; ".join(said) + more + "."


def _grid(trace: Any, most: int = 15) -> str:
    """A heatmap's named rows and columns as words (numbered ones say nothing)."""
    said = ""
    for axis, name in (("y", "Rows"), ("x", "Columns")):
        ticks = [_plain(str(t)) for t in trace[axis] or () if isinstance(t, str)]
        if ticks:
            more = f", {len(ticks) - most} more" if len(ticks) > most else ""
            said += f" {name}: " + ", ".join(dict.fromkeys(ticks[:most])) + more + "."
    return said


def alt_text(fig: go.Figure) -> str:
    """What the picture of ``fig`` shows, in words: its kind, title, axes and series (the alt
    text saved with a chart's picture, for a reader who cannot see it).

    >>> fig = go.Figure(go.Bar(y=[1, 2], name="new"), layout={"title": "Rows"})
    >>> fig = fig.update_layout(yaxis_title="rank")
    >>> alt_text(fig)
    'A bar chart: Rows. y axis: rank. Series: new.'
    """
    parts = []
    for trace in fig.data:
        kind = _KINDS.get(trace.type, trace.type + " chart")
        if trace.type == "treemap":
            kind = f"treemap of {len(trace.labels or ())} boxes"
        elif trace.type == "sankey":
            kind = f"Sankey diagram of {len(trace.node.label or ())} nodes"
        if kind not in parts:
            parts.append(kind)
    words = ("A " + " and ".join(parts)) if parts else "An empty chart"
    words += ": " + (_plain(fig.layout.title.text) or "untitled") + "."
    words += "".join(_flows(t) for t in fig.data if t.type == "sankey")
    words += "".join(_grid(t) for t in fig.data if t.type == "heatmap")
    layout = fig.layout.to_plotly_json()
    for name in sorted(k for k in layout if re.fullmatch(r"[xy]axis\d*", k)):
        title = _plain(fig.layout[name].title.text)
        if title:
            words += f" {name[0]} axis: {title}."
    series = [_plain(t.name) for t in fig.data if t.name and t.showlegend is not False]
    if series:
        words += " Series: " + ", ".join(dict.fromkeys(series)) + "."
    notes = [_plain(a.text) for a in fig.layout.annotations if a.text]
    if notes:
        words += " Labels: " + "; ".join(dict.fromkeys(notes)) + "."
    return words


# --- static pictures -----------------------------------------------------------------------------

_status: dict[str, str] = {"state": "not tried"}


def static_image_status() -> str:
    """Why the last picture was or was not made: ``made``, ``off (...)`` or ``unavailable: ...``."""
    return _status["state"]


def static_png(fig: go.Figure, *, width: int = IMAGE_WIDTH) -> bytes | None:
    """A PNG of ``fig`` at ``width`` pixels, or None when no picture can be made here.

    kaleido drives a Chromium (Debian's /usr/bin/chromium is found without configuration); one
    browser is started on first use and kept for the process. Without kaleido or a Chromium the
    notebook still runs and prints the same text: the saved notebook just has no picture.
    """
    if os.environ.get(STATIC_IMAGES_ENV, "1") == "0":
        _status["state"] = f"off ({STATIC_IMAGES_ENV}=0)"
        return None
    server = _kaleido_server()
    if server is None:
        return None
    height = fig.layout.height or 450
    opts = {"format": "png", "width": width, "height": height, "scale": IMAGE_SCALE}
    try:
        png = server.calc_fig_sync(fig.to_dict(), opts=opts)
    except Exception as exc:  # any failure of the picture leaves the live chart as it is
        _status["state"] = f"unavailable: {type(exc).__name__}: {exc}"
        return None
    _status["state"] = "made"
    return png


@cache
def _kaleido_server() -> Any:
    """kaleido with one browser kept running, or None (and the reason in the status)."""
    try:
        import kaleido
    except ImportError:
        _status["state"] = "unavailable: kaleido is not installed"
        return None
    try:
        # Building a Kaleido looks for the browser (and raises without one) but starts nothing;
        # the sync server would fail in its own thread instead, printing a traceback.
        kaleido.Kaleido()
        kaleido.start_sync_server(silence_warnings=True)
    except Exception as exc:  # no Chromium, or one that does not start
        _status["state"] = f"unavailable: {type(exc).__name__}: {exc}"
        return None
    atexit.register(kaleido.stop_sync_server, silence_warnings=True)
    return kaleido
