from loadkit_notebooks.scenario import Record, outcome_table, run_behaviours
from loadkit_notebooks.viz import figure, figure_data, record_view


def scenario(behaviour, n=3):
    r = Record(behaviour)
    k = 2 if behaviour == "old" else 1
    for i in range(n):
        r.add_point("clones", i, (i + 1) * k)
    r.outcome = {"clones": n * k, "prefix": "" if behaviour == "new" else None}
    return r


def test_run_behaviours_runs_each_in_order():
    recs = run_behaviours(scenario, n=2)
    assert list(recs) == ["old", "new"]
    assert recs["old"].series["clones"].y == [2, 4]
    assert recs["new"].outcome["clones"] == 2


def test_outcome_table_and_summary():
    recs = run_behaviours(scenario)
    table = outcome_table(recs).splitlines()
    assert table[0].split() == ["old", "new"]
    assert table[1].split() == ["clones", "6", "3"]
    assert recs["new"].summary().splitlines()[0] == "[new]"


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
