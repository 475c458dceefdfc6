"""A notebook open in JupyterLab in headless Chromium, driven as a person would drive it.

Selectors and the Run All retry are the ones recorded in NOTEBOOK-STACK.md. Everything the page
says on its console is kept, so a failure can name what the browser complained about.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from playwright.sync_api import BrowserContext, Page
from playwright.sync_api import Error as PlaywrightError

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

IDLE = ".jp-Notebook-ExecutionIndicator[data-status='idle']"
PROMPTS = ".jp-Notebook .jp-CodeCell .jp-InputArea-prompt"
TOGGLES = ".widget-toggle-buttons"
PLOT = ".js-plotly-plot"

# The first plotly chart's traces as plain lists (typed arrays and plotly's base64 arrays decoded).
CHART_STATE_JS = """
(el) => {
  const TYPES = {f8: Float64Array, f4: Float32Array, i1: Int8Array, u1: Uint8Array,
                 i2: Int16Array, u2: Uint16Array, i4: Int32Array, u4: Uint32Array,
                 i8: BigInt64Array, u8: BigUint64Array};
  const plain = (v) => {
    if (v === undefined || v === null) return [];
    if (ArrayBuffer.isView(v)) return Array.from(v, Number);
    if (Array.isArray(v)) return v;
    if (typeof v === 'object' && 'bdata' in v) {
      const bytes = Uint8Array.from(atob(v.bdata), (c) => c.charCodeAt(0));
      return Array.from(new TYPES[v.dtype](bytes.buffer), Number);
    }
    return [v];
  };
  // A heatmap's z: rows of cells, as nested arrays or one typed array with a shape.
  const grid = (z) => {
    if (z === undefined || z === null) return [];
    if (Array.isArray(z)) return z.map((row) => plain(row));
    if (typeof z === 'object' && 'bdata' in z && z.shape) {
      const flat = plain(z);
      const cols = Number(String(z.shape).split(',')[1]);
      const rows = [];
      for (let i = 0; i < flat.length; i += cols) rows.push(flat.slice(i, i + cols));
      return rows;
    }
    return [plain(z)];
  };
  const title = el.layout && el.layout.title;
  return {
    title: (title && (typeof title === 'string' ? title : title.text)) || '',
    traces: (el.data || []).map((t) => ({
      name: t.name === undefined ? null : t.name,
      type: t.type || 'scatter',
      mode: t.mode === undefined ? null : t.mode,
      x: plain(t.x),
      y: plain(t.y),
      z: grid(t.z),
    })),
  };
}
"""


class NotebookPage:
    """One browser tab on one notebook of a running JupyterLab."""

    def __init__(self, context: BrowserContext, base_url: str, name: str) -> None:
        self.base_url = base_url
        self.name = name
        self.console: list[str] = []
        self.errors: list[str] = []
        self.page: Page = context.new_page()
        self.page.on("console", self._on_console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))

    def _on_console(self, msg: Any) -> None:
        line = f"{msg.type}: {msg.text}"
        self.console.append(line)
        if msg.type == "error":
            self.errors.append(line)

    # -- opening and running -------------------------------------------------------------------

    def open(self, timeout: float = 90.0) -> None:
        """Open the notebook (``?reset``: no earlier workspace) and wait for its kernel, idle."""
        self.page.goto(f"{self.base_url}/lab/tree/{self.name}?reset")
        self._wait(
            lambda: (
                not self._accept_kernel_dialog()
                and self.page.locator(IDLE).count() > 0
                and self._kernel_state() == "idle"
            ),
            timeout,
            f"a kernel for {self.name} to start and be idle",
        )

    def _kernel_state(self) -> str | None:
        with urllib.request.urlopen(f"{self.base_url}/api/sessions", timeout=5) as r:
            sessions = json.load(r)
        states = [s["kernel"]["execution_state"] for s in sessions if s["path"] == self.name]
        return states[0] if states else None

    def _accept_kernel_dialog(self) -> bool:
        """Answer JupyterLab's "Select Kernel" dialog with its default, as a person would.

        Seen now and then on a busy machine although the notebook names its kernel.
        """
        dialog = self.page.locator(".jp-Dialog")
        if dialog.count() and "Select Kernel" in dialog.first.inner_text():
            dialog.first.locator("button.jp-mod-accept").click()
            return True
        return False

    def prompts(self) -> list[str]:
        # textContent, not innerText: cells scrolled out of view are not rendered
        # (content-visibility), and their innerText is empty.
        return [(p or "").strip() for p in self.page.locator(PROMPTS).all_text_contents()]

    def _menu(self, menu: str, item: str) -> None:
        self._accept_kernel_dialog()
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
        self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).click()

    def clear_outputs(self) -> None:
        """Saved outputs hold dead widget views and old prompts: clear them before running."""
        self._menu("Edit", "Clear Outputs of All Cells")
        self._wait(
            lambda: all(p == "[ ]:" for p in self.prompts()),
            10,
            "cleared prompts",
            lambda: f"prompts {self.prompts()}",
        )

    def run_all(self, attempts: int = 4, settle: float = 5.0) -> None:
        """Run > Run All Cells; the first click sometimes does nothing, so retry until it runs."""
        for _ in range(attempts):
            self._menu("Run", "Run All Cells")
            deadline = time.monotonic() + settle
            while time.monotonic() < deadline:
                if any(p != "[ ]:" for p in self.prompts()):
                    return
                time.sleep(0.1)
        raise AssertionError(f"Run All Cells never started after {attempts} clicks")

    def wait_run_finished(self, timeout: float = 180.0) -> None:
        """Every code cell has a number and the kernel is idle; else name the cells that failed."""
        try:
            self._wait(
                lambda: "[*]:" not in self.prompts(),
                timeout,
                "Run All to finish",
                lambda: f"prompts {self.prompts()}",
            )
            self.page.wait_for_selector(IDLE, timeout=timeout * 1000)
        except PlaywrightError as exc:
            raise AssertionError(f"the notebook did not finish running: {exc}") from exc
        prompts = self.prompts()
        unrun = [i for i, p in enumerate(prompts) if not re.fullmatch(r"\[\d+\]:", p)]
        if unrun:
            raise AssertionError(
                f"Run All stopped: code cells {unrun} did not run (prompts {prompts}); "
                f"error output in the page:\n{self.error_outputs()}"
            )

    def error_outputs(self) -> str:
        sel = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
        return "\n".join(t or "" for t in self.page.locator(sel).all_text_contents())[-4000:]

    # -- the main toggle and the chart it drives -----------------------------------------------

    def main_toggle(self) -> Any:
        """The first ToggleButtons in the page, scrolled into view as a person would."""
        toggle = self.page.locator(TOGGLES).first
        toggle.wait_for(timeout=30_000)
        toggle.scroll_into_view_if_needed()
        return toggle

    def toggle_labels(self) -> list[str]:
        buttons = self.main_toggle().locator("button.widget-toggle-button")
        return [(t or "").strip() for t in buttons.all_text_contents()]

    def active_label(self) -> str | None:
        active = self.main_toggle().locator("button.widget-toggle-button.mod-active")
        return (active.first.text_content() or "").strip() if active.count() else None

    def toggle_at(self, index: int) -> Any:
        """The ``index``-th ToggleButtons in the page (0 is the main toggle)."""
        toggle = self.page.locator(TOGGLES).nth(index)
        toggle.wait_for(timeout=30_000)
        toggle.scroll_into_view_if_needed()
        return toggle

    def active_label_at(self, index: int) -> str | None:
        """The pressed button's label on the ``index``-th ToggleButtons."""
        found = self.toggle_at(index).locator("button.widget-toggle-button.mod-active")
        return (found.first.text_content() or "").strip() if found.count() else None

    def click_toggle_at(self, index: int, label: str) -> None:
        """Press ``label`` on the ``index``-th ToggleButtons and wait until it shows pressed."""
        self.toggle_at(index).get_by_role("button", name=label, exact=True).click()
        self._wait(
            lambda: self.active_label_at(index) == label,
            10,
            f"toggle {index} button {label!r} pressed",
            lambda: f"{self.active_label_at(index)!r} pressed",
        )

    def click_toggle(self, label: str) -> None:
        button = self.main_toggle().get_by_role("button", name=label, exact=True)
        button.click()
        self._wait(
            lambda: self.active_label() == label,
            10,
            f"toggle button {label!r} pressed",
            lambda: f"{self.active_label()!r} pressed",
        )

    def chart_state(self) -> dict[str, Any]:
        """The first chart after the main toggle, in page order: the chart the toggle drives."""
        plot = self.main_toggle().locator("xpath=following::div[contains(@class,'js-plotly-plot')]")
        plot = plot.first
        plot.wait_for(timeout=30_000)
        return plot.evaluate(CHART_STATE_JS)

    def chart_state_at(self, index: int) -> dict[str, Any]:
        """The ``index``-th chart of the page, in page order (0: the first)."""
        plot = self.page.locator(PLOT).nth(index)
        plot.wait_for(timeout=30_000)
        return plot.evaluate(CHART_STATE_JS)

    def chart_js_at(self, index: int, script: str) -> Any:
        """``script`` (a JavaScript function of the plot element) run on the ``index``-th chart."""
        plot = self.page.locator(PLOT).nth(index)
        plot.wait_for(timeout=30_000)
        return plot.evaluate(script)

    # -- the other widgets: text boxes, dropdowns, buttons, HTML --------------------------------

    def _widget(self, kind: str, description: str) -> Any:
        """The widget of class ``widget-KIND`` (``kind``: one or more of ``text``, ``combobox``,
        ``dropdown``, joined by ``|``) whose label reads ``description``."""
        label = f":has(> label:text-is('{description}'))"
        kinds = ", ".join(f".widget-{k}{label}" for k in kind.split("|"))
        found = self.page.locator(kinds).first
        found.wait_for(timeout=30_000)
        found.scroll_into_view_if_needed()
        return found

    def type_into(self, description: str, value: str) -> None:
        """Type ``value`` into the text box (or combobox) labelled ``description`` and press
        Enter, as a person would (the notebooks' boxes update on Enter, not on each key)."""
        box = self._widget("text|combobox", description).locator("input")
        box.fill(value)
        box.press("Enter")

    def text_value(self, description: str) -> str:
        return self._widget("text|combobox", description).locator("input").input_value()

    def html_after(self, description: str) -> str:
        """The text of the first HTML widget after the widget labelled ``description``."""
        widget = self._widget("dropdown|text|combobox", description)
        html = widget.locator("xpath=following::div[contains(@class,'widget-html')][1]")
        return html.inner_text()

    def choose(self, description: str, label: str) -> None:
        """Pick the option shown as ``label`` in the dropdown labelled ``description``."""
        self._widget("dropdown", description).locator("select").select_option(label=label)

    def click_button(self, label: str) -> None:
        button = self.page.locator("button.jupyter-button", has_text=label).first
        button.scroll_into_view_if_needed()
        button.click()

    def button_disabled(self, label: str) -> bool:
        return self.page.locator("button.jupyter-button", has_text=label).first.is_disabled()

    def wait_for(self, ok: Any, what: str, seen: Any = None, timeout: float = 30.0) -> None:
        """Wait until ``ok()`` holds (a widget's callback ran in the kernel and the page drew)."""
        self._wait(ok, timeout, what, seen)

    def zoom_treemap(self, label: str) -> None:
        """Click the first treemap box whose text holds ``label``, as a reader zooms in."""
        box = self.page.locator("g.slice").filter(has_text=label).first
        box.scroll_into_view_if_needed()
        box.locator("path.surface").first.click(force=True)
        self.page.wait_for_timeout(1000)  # plotly's zoom transition

    def dirty(self) -> bool:
        """Does JupyterLab mark the notebook modified (its tab's dot)?"""
        return self.page.locator(".jp-mod-dirty").count() > 0

    def chart_widths(self) -> list[tuple[float, float]]:
        """Each chart's width and the width of the output area it sits in, in pixels."""
        return self.page.locator(PLOT).evaluate_all(
            "(els) => els.map((el) => [el.getBoundingClientRect().width,"
            " el.closest('.jp-OutputArea-output').getBoundingClientRect().width])"
        )

    def rerun_cell_of_main_toggle(self) -> None:
        """Run again the cell whose output holds the main toggle (Shift+Enter), as a person
        would, and wait for the fresh toggle."""
        cell = self.main_toggle().locator("xpath=ancestor::div[contains(@class,'jp-CodeCell')][1]")
        cell.locator(".jp-InputArea-prompt").click()
        before = self.prompts()
        self.page.keyboard.press("Shift+Enter")
        self._wait(
            lambda: self.prompts() != before and "[*]:" not in self.prompts(),
            120,
            "the toggle's cell to run again",
            lambda: f"prompts {self.prompts()}",
        )
        self.page.wait_for_selector(IDLE, timeout=60_000)

    # -- leaving, and evidence on failure ------------------------------------------------------

    def close(self) -> None:
        """Close the tab and end the notebook's kernel in the background (frees its memory while
        the next test runs; the server's stop ends any kernel still shutting down)."""
        with contextlib.suppress(PlaywrightError, OSError):
            xsrf = {c["name"]: c["value"] for c in self.page.context.cookies(self.base_url)}
            with urllib.request.urlopen(f"{self.base_url}/api/sessions", timeout=5) as r:
                ids = [s["id"] for s in json.load(r) if s["path"] == self.name]
            token = xsrf.get("_xsrf", "")
            headers = {"X-XSRFToken": token, "Cookie": f"_xsrf={token}"}
            for sid in ids:
                request = urllib.request.Request(
                    f"{self.base_url}/api/sessions/{sid}", method="DELETE", headers=headers
                )
                threading.Thread(target=_send_quietly, args=(request,), daemon=True).start()
        with contextlib.suppress(PlaywrightError):
            self.page.close()

    @contextlib.contextmanager
    def evidence_on_failure(self, folder: Path, extra: str = "") -> Iterator[None]:
        """On any failure, save a screenshot and the console errors; name them in the message."""
        try:
            yield
        except (AssertionError, PlaywrightError) as exc:
            stem = Path(self.name).stem
            shot = folder / f"{stem}-failure.png"
            log = folder / f"{stem}-console.txt"
            try:
                with contextlib.suppress(PlaywrightError):  # show the chart, if there is one
                    self.page.locator(PLOT).first.scroll_into_view_if_needed(timeout=2000)
                self.page.screenshot(path=str(shot), full_page=True)
            except PlaywrightError as shot_exc:
                shot = Path(f"(no screenshot: {shot_exc})")
            log.write_text(
                f"console errors ({len(self.errors)}):\n"
                + "\n".join(self.errors)
                + f"\n\nwhole console ({len(self.console)} messages):\n"
                + "\n".join(self.console)
                + "\n"
            )
            what = "" if isinstance(exc, AssertionError) else f"{type(exc).__name__}: "
            raise AssertionError(
                f"{what}{exc}\n"
                f"  screenshot: {shot}\n"
                f"  console errors ({len(self.errors)}): {log}" + (f"\n  {extra}" if extra else "")
            ) from None

    def _wait(self, ok: Any, timeout: float, what: str, seen: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            if time.monotonic() > deadline:
                where = f"; page shows {seen()}" if seen else ""
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{where}")
            time.sleep(0.1)


def _send_quietly(request: urllib.request.Request) -> None:
    with contextlib.suppress(urllib.error.URLError, OSError):
        urllib.request.urlopen(request, timeout=60).close()
