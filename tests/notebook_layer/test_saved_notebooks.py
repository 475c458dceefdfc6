"""The committed notebooks read well without a kernel; the chart widget's display bundle."""

import pytest
from repo_paths import NOTEBOOKS as NOTEBOOKS_DIR

from loadkit_notebooks import saved

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_has_pictures_and_no_dead_widgets(path):
    assert saved.problems(path) == []


def test_problems_are_found(tmp_path):
    import json

    out = {
        "output_type": "display_data",
        "data": {saved.WIDGET_VIEW: {"model_id": "gone"}, "text/plain": "chart: t"},
    }
    bare = {"output_type": "display_data", "data": {"text/plain": "picture: p"}}
    long = {"output_type": "stream", "name": "stdout", "text": "x" * 101 + "\n"}
    wide = {"output_type": "execute_result", "data": {"text/plain": "ok\n" + "y" * 102}}
    error = {"output_type": "error", "ename": "E", "evalue": "z" * 103, "traceback": []}
    path = tmp_path / "nb.ipynb"
    cells = [{"outputs": [out, long]}, {"outputs": [wide]}, {"outputs": [error]}]
    cells.append({"outputs": [bare]})
    path.write_text(json.dumps({"cells": cells, "metadata": {}}))
    found = saved.problems(path)
    assert any("dead widget" in f for f in found)
    assert any("'chart: t' has no picture" in f for f in found)
    assert "nb.ipynb cell 3: 'picture: p' has no picture" in found
    assert "nb.ipynb cell 0: a line of 101 columns: " + "x" * 60 + "..." in found
    assert "nb.ipynb cell 1: a line of 102 columns: " + "y" * 60 + "..." in found
    assert "nb.ipynb cell 2: a line of 103 columns: " + "z" * 60 + "..." in found
    nb = json.loads(path.read_text())
    assert (
        saved.drop_dead_views(nb) == 1
        and saved.WIDGET_VIEW not in nb["cells"][0]["outputs"][0]["data"]
    )


def test_chart_bundle_has_text_and_a_picture_when_one_can_be_made(monkeypatch):
    pytest.importorskip("anywidget")
    import plotly.graph_objects as go

    from loadkit_notebooks import chart

    c = chart.Chart(go.Figure(go.Bar(y=[1, 2]), layout={"title": "two", "height": 200}))
    assert c.spec["data"][0]["y"] == [1, 2]  # in the widget's state from the start
    monkeypatch.setenv(chart.STATIC_IMAGES_ENV, "0")
    bundle = c._repr_mimebundle_()
    assert bundle["text/plain"] == "chart: two" and "image/png" not in bundle
    assert saved.WIDGET_VIEW in bundle
    monkeypatch.delenv(chart.STATIC_IMAGES_ENV)
    png = chart.static_png(c.fig)
    if png is None:
        assert chart.static_image_status().startswith("unavailable")
    else:
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and chart.static_image_status() == "made"
