"""The progress bar of a long inspect: on stderr, once the inspect has run ``delay`` seconds.

An inspect counts its long loops (the shards whose headers it reads, the names the dry load
feeds the model) through ``Progress.stage``; the bar shows the loop running at the time, and
only once the inspect as a whole has run ``delay`` seconds (2 by default,
``LOADKIT_PROGRESS_DELAY`` to change it), so a quick inspect prints nothing. tqdm is imported
when the bar first shows: its imports cost a quick header-only inspect more than its headers.
Each stage's bar is cleared when the next one starts or the inspect ends; the report follows on
stdout alone. Torch-free.

>>> with Progress(delay=3600.0) as progress:  # an inspect that ends long before: no bar
...     count = progress.stage("reading headers", "shard")
...     for done in range(4):
...         count(done, 3)
>>> Progress(enabled=False).stage("reading headers", "shard") is None
True
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from loadkit.errors import LoadkitError

DEFAULT_DELAY = 2.0  # seconds an inspect runs before its bar shows
DELAY_VARIABLE = "LOADKIT_PROGRESS_DELAY"

Count = Callable[[int, int], None]  # called with (done, total) as a loop goes


def progress_delay(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds before the bar shows: ``LOADKIT_PROGRESS_DELAY`` when set in ``environ``
    (``0``: at once), else 2.

    >>> progress_delay({"LOADKIT_PROGRESS_DELAY": "0.5"}), progress_delay({})
    (0.5, 2.0)
    """
    text = environ.get(DELAY_VARIABLE, "").strip()
    if not text:
        return DEFAULT_DELAY
    try:
        delay = float(text)
    except ValueError:
        delay = -1.0
    if not 0 <= delay < float("inf"):
        raise LoadkitError(f"{DELAY_VARIABLE}={text!r}: not a number of seconds (0 or more)")
    return delay


class Progress:
    """The bar of one inspect, a context manager that clears it on exit. ``stage(desc, unit)``
    gives a loop its counter; the counter last called is the one shown, from ``delay`` seconds
    after the inspect began (``None``: ``progress_delay()``), on ``file`` (``sys.stderr`` by
    default). Not ``enabled``: every stage's counter is ``None``, and nothing shows."""

    def __init__(
        self, enabled: bool = True, delay: float | None = None, file: TextIO | None = None
    ) -> None:
        if delay is None:  # the environment is read only for a bar that may show
            delay = progress_delay() if enabled else DEFAULT_DELAY
        self.enabled = enabled
        self.delay = delay
        self.file = file
        self.started = time.monotonic()
        self._bar: Any = None  # a tqdm bar, once one shows
        self._shown: object = None  # the stage whose bar it is

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stage(self, desc: str, unit: str) -> Count | None:
        """A counter for one loop, shown as ``desc`` counting ``unit``s (``None`` when not
        enabled: the loop counts nothing)."""
        if not self.enabled:
            return None
        stage = object()

        def count(done: int, total: int) -> None:
            self._count(stage, desc, unit, done, total)

        return count

    def _count(self, stage: object, desc: str, unit: str, done: int, total: int) -> None:
        bar = self._bar
        if bar is None or self._shown is not stage:
            if time.monotonic() - self.started < self.delay:
                return
            bar = self._show(stage, desc, unit, total)
        if bar.total != total or done < bar.n:  # the loop began again (a dry load's next pass)
            bar.reset(total=total)
        bar.update(done - bar.n)

    def _show(self, stage: object, desc: str, unit: str, total: int) -> Any:
        from tqdm import tqdm

        self.close()
        self._shown = stage
        self._bar = tqdm(
            desc=desc, total=total, unit=unit, file=self.file or sys.stderr, leave=False
        )
        return self._bar

    def close(self) -> None:
        """Clear the bar, if one shows."""
        if self._bar is not None:
            self._bar.close()
        self._bar = self._shown = None
