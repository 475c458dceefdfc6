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
    mute = {"output_type": "display_data", "data": {"text/plain": "picture: q", "image/png": ""}}
    long = {"output_type": "stream", "name": "stdout", "text": "x" * 101 + "\n"}
    wide = {"output_type": "execute_result", "data": {"text/plain": "ok\n" + "y" * 102}}
    error = {"output_type": "error", "ename": "E", "evalue": "z" * 103, "traceback": []}
    path = tmp_path / "nb.ipynb"
    cells = [{"outputs": [out, long]}, {"outputs": [wide]}, {"outputs": [error]}]
    cells.append({"outputs": [bare, mute]})
    kernelspec = {"display_name": "Python 3", "language": "python", "name": "python3"}
    path.write_text(json.dumps({"cells": cells, "metadata": {"kernelspec": kernelspec}}))
    found = saved.problems(path)
    assert "nb.ipynb cell 3: a picture without alt text" in found
    assert any(f.startswith("nb.ipynb: kernelspec {'display_name': 'Python 3',") for f in found)
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
    data, metadata = c._repr_mimebundle_()
    assert data["text/plain"] == "chart: two" and "image/png" not in data and metadata == {}
    assert saved.WIDGET_VIEW in data
    monkeypatch.delenv(chart.STATIC_IMAGES_ENV)
    png = chart.static_png(c.fig)
    if png is None:
        assert chart.static_image_status().startswith("unavailable")
        return
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and chart.static_image_status() == "made"
    data, metadata = c._repr_mimebundle_()
    assert "image/png" in data
    assert metadata == {"image/png": {"alt": "A bar chart: two."}}


def test_kernelspec_is_the_installed_ipykernel_one():
    """The spec JupyterLab writes into a notebook it opens: a notebook saved with it opens
    unmodified."""
    kernelspec = pytest.importorskip("jupyter_client.kernelspec")
    spec = kernelspec.KernelSpecManager().get_kernel_spec("python3")
    assert saved.KERNELSPEC == {
        "display_name": spec.display_name,
        "language": spec.language,
        "name": "python3",
    }


def test_alt_text_says_what_a_picture_shows():
    go = pytest.importorskip("plotly.graph_objects")
    from loadkit_notebooks import chart

    sankey = go.Sankey(
        node={"label": ["lm_head", "<b>loaded</b>", "skipped"]},
        link={"source": [0, 0], "target": [1, 2], "value": [1, 3]},
    )
    fig = go.Figure(sankey, layout={"title": "Where names went<br>(two)"})
    fig.add_annotation(text='<span style="color:red">\u25a0</span> 3 loaded &amp; kept')
    assert chart.alt_text(fig) == (
        "A Sankey diagram of 3 nodes: Where names went (two)."
        " Flows: lm_head to skipped (3); lm_head to loaded (1). Labels: 3 loaded & kept."
    )
    fig = go.Figure([go.Bar(y=[1], name="old"), go.Heatmap(z=[[1]], showlegend=False, name="x")])
    fig.update_layout(xaxis_title="rank", yaxis2={"title": {"text": "row"}})
    assert chart.alt_text(fig) == (
        "A bar chart and heatmap: untitled. x axis: rank. y axis: row. Series: old."
    )
