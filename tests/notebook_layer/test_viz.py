"""The live chart and its old/new toggle."""

from loadkit_notebooks.scenario import run_behaviours
from loadkit_notebooks.viz import figure, figure_data, record_view

from .test_scenario import scenario


def test_toggle_swaps_the_chart_between_records():
    recs = run_behaviours(scenario)
    seen = []
    view = record_view(
        recs, lambda r: figure(r, title="probe"), on_change=lambda r: seen.append(r.behaviour)
    )
    assert view.toggle.value == "old"
    assert list(view.chart.fig.data[0].y) == [2, 4, 6]
    view.toggle.value = "new"
    assert list(view.chart.fig.data[0].y) == [1, 2, 3]
    assert view.chart.spec["data"][0]["y"] == [1, 2, 3]  # the synced state follows
    assert view.chart.fig.layout.title.text == "probe [new]"
    assert "clones: 3 points, from 1 to 3 (min 1, max 3)" in figure_data(view.chart)
    assert seen == ["new"]
