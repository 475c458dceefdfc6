// A plotly chart whose whole figure lives in one synced trait, "spec" ({data, layout}).
//
// Every view draws the model's current figure, so a view created late (a re-run display cell, a
// re-rendered output) never misses an update, and each change of "spec" redraws it with
// Plotly.react. The chart follows its box's width: it is drawn at whatever width the box has,
// and a ResizeObserver resizes it when the box is attached to the page or changes width.
//
// plotly.js arrives as the text of the "_plotly_js" trait and is evaluated once per page, when
// the first chart renders: this module stays small, so the widget manager, which gives a module
// two seconds to load, never times out on a busy machine.

function plotly(model) {
  if (!globalThis.__loadkitPlotly) {
    // plotly.js is a UMD bundle: handed a CommonJS `module`, it fills `module.exports`.
    const source =
      "const module = { exports: {} };\nconst exports = module.exports;\n" +
      model.get("_plotly_js") +
      "\nexport default module.exports;\n";
    const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
    globalThis.__loadkitPlotly = import(url).then((mod) => {
      URL.revokeObjectURL(url);
      return mod.default;
    });
  }
  return globalThis.__loadkitPlotly;
}

async function render({ model, el }) {
  el.classList.add("loadkit-chart");
  el.style.width = "100%";
  const plot = document.createElement("div");
  el.appendChild(plot);
  const Plotly = await plotly(model);

  const draw = () => {
    const spec = structuredClone(model.get("spec"));
    const layout = { ...(spec.layout || {}), autosize: true };
    delete layout.width; // the box decides the width
    return Plotly.react(plot, spec.data || [], layout, { responsive: true, displaylogo: false });
  };

  let width = 0;
  const observer = new ResizeObserver((entries) => {
    const seen = Math.round(entries[entries.length - 1].contentRect.width);
    if (seen > 0 && seen !== width) {
      width = seen;
      Plotly.Plots.resize(plot);
    }
  });
  model.on("change:spec", draw);
  await draw();
  observer.observe(el);
  return () => {
    observer.disconnect();
    model.off("change:spec", draw);
    Plotly.purge(plot);
  };
}

export default { render };
