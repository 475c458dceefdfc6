"""The notebooks' old/new records: each behaviour run in order, the outcome table."""

from loadkit_notebooks.scenario import Record, outcome_table, run_behaviours


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
