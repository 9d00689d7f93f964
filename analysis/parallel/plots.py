"""The PNG plots of `devprof analyze`, drawn by a forked helper while this process writes the other files.

matplotlib's import (about 0.45 s) and drawing the plots (about 0.25 s) were half of the command's
fixed cost. The helper is forked before the trace is read, once pandas is loaded (shared with it)
and before any event is decoded (so it holds none of them); it waits until a core is free (`go`:
the read's own child has ended, or the trace is read), then imports matplotlib and draws the plots
it is sent with the same plot functions. Where it is lost, the plots are drawn here: the same
files, and the same error where one cannot be written.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

from analysis.parallel.child import Child

PLOTS = ("plot_step_breakdown", "plot_epoch_breakdown", "plot_utilization")  # analysis.render.plots
Jobs = list[tuple[str, tuple]]
GO = "go"
WAIT_S = 120.0  # drawing takes under a second; a helper that takes this long is given up on


def _serve(receive: Callable[[], object]) -> list[Path]:
    if receive() != GO:
        raise RuntimeError("not told to go")
    jobs: list = []

    def read() -> None:
        try:
            jobs.append(receive())
        except (EOFError, OSError):  # the parent ended or let go of it: no plots to draw, nothing to say
            pass

    # The request is read while matplotlib is imported: a large one never keeps the parent waiting.
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    import_2d_matplotlib()
    from analysis.render import plots

    reader.join()
    if not jobs:
        raise EOFError("no plots asked for")
    return [getattr(plots, name)(*args) for name, args in jobs[0] if name in PLOTS]


class PlotHelper:
    """The parent's handle on the helper: `go` once a core is free, `draw` once, `close` always."""

    def __init__(self, child: Child):
        self.child = child
        self._going = False

    def go(self) -> None:
        if not self._going:
            self._going = True
            self.child.send(GO)

    def draw(self, jobs: Jobs) -> Callable[[], list[Path]]:
        """Send the helper `jobs` (`(plot function name, args)`); gives what waits for the paths of the
        plots, drawn by the helper or, where it is lost, here."""
        self.go()
        sent = self.child.send(jobs)

        def drawn() -> list[Path]:
            answer = self.child.result(timeout_s=WAIT_S) if sent else None
            self.close()
            if answer is not None and isinstance(answer[0], list):
                return answer[0]
            return draw_here(jobs)

        return drawn

    def close(self) -> None:
        self.child.close()


def start(fork: Callable[..., Child | None]) -> PlotHelper | None:
    child = fork(_serve)
    return PlotHelper(child) if child is not None and child.started else None


def draw_here(jobs: Jobs) -> list[Path]:
    from analysis.render import plots

    return [getattr(plots, name)(*args) for name, args in jobs]


def import_2d_matplotlib() -> None:
    """matplotlib's figure and Agg backend without its 3-D toolkit. matplotlib imports
    `mpl_toolkits.mplot3d` only to register the "3d" projection, a quarter of its import time (0.08 of
    0.33 s); the helper draws 2-D plots and is its own process, so that import is refused here (matplotlib
    then warns that the 3-D projection is unavailable, which is on purpose and not shown)."""
    from analysis.render import mpl_config

    mpl_config.ensure_config_dir()
    if "mpl_toolkits.mplot3d" not in sys.modules:  # None: `import` raises ImportError, which matplotlib catches
        sys.modules["mpl_toolkits.mplot3d"] = None  # type: ignore[assignment]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Unable to import Axes3D")
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
