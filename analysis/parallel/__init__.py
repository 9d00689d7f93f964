"""Work beside the analysis on another core: the one place that forks.

Reading and analysing a trace is numpy work on one core. `Helpers`, made once by the caller (the
command, or `analysis.analyze`) and passed down, lends the reader and the worker's straight line a
second one: a forked child decodes part of the events (`child`), analyses the tf.data stages and
eager ops beside the step analysis (`beside`), and draws the PNG plots (`plots`), each started when
a core is free. Stages never import this package; the command, the pipeline and the reader do.
Whatever a child fails to do is done here, so the results are those of one process.

A fork is safe only in a process of one OS thread (a lock another thread held stays held in the
child): `can_fork` counts them, so numpy's BLAS threads, TensorFlow's or a caller's own turn it off
(the command sets OPENBLAS_NUM_THREADS=1 before numpy starts). DEVPROF_FORK=0 turns it off too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from analysis.parallel.child import Beside, Child

if TYPE_CHECKING:
    from analysis.parallel.plots import PlotHelper
    from analysis.read.xplane_wire import Begun

ENV_VAR = "DEVPROF_FORK"  # 0: all the reading and analysis in this one process
T = TypeVar("T")


def can_fork() -> bool:
    """Whether a forked child can share the work: Linux's fork, two cores or more, a process of one OS
    thread, and not a pool's worker (its siblings have the other cores)."""
    if os.environ.get(ENV_VAR, "").strip() == "0" or not hasattr(os, "fork"):
        return False
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is not None and multiprocessing.parent_process() is not None:
        return False
    try:
        return os_threads() == 1 and len(os.sched_getaffinity(0)) >= 2
    except (AttributeError, OSError):
        return False


def os_threads() -> int:
    """This process's threads as the OS counts them (Python's and native ones)."""
    return len(os.listdir("/proc/self/task"))


class Helpers:
    """The children that lend the analysis another core, each forked where `can_fork()` says it is safe
    at that moment (and `fork` allows any); where none is, each method gives what to do here instead.
    `core_free()` (a child's answer is in, or the trace is read) starts the work that waited for a
    core: the plot helper's imports."""

    def __init__(self, fork: bool = True):
        self.fork = fork
        self.plots: PlotHelper | None = None
        self._waiting: list[Callable[[], object]] = []
        self._begun: Begun | None = None  # a decode begun before the read

    def child(self, work: Callable[[Callable[[], object]], object]) -> Child | None:
        """A child running `work(receive)`, or None where none can be forked."""
        if not (self.fork and can_fork()):
            return None
        child = Child(work, on_end=self.core_free)
        return child if child.started else None

    def beside(self, work: Callable[[Callable[[], object]], T], wanted: bool = True) -> Beside[T]:
        """`work(given)` in a child while this process goes on (where `wanted` and one can be forked)."""
        return Beside(work, self.child if wanted else lambda _work: None)

    def begin_reading(self, path) -> None:
        """Begin decoding the trace `path` names, where it names one host's trace plainly (not a folder of
        other runs: a job's workers are read by a pool), before the caller imports pandas and the
        analysis: the read that follows finishes it (`take_begun`)."""
        if not (self.fork and can_fork()):
            return
        from pathlib import Path

        from analysis.read import locate
        from analysis.read import xplane_wire as wire
        from analysis.read.stat_names import READ_NUMBERS, READ_STATS

        try:
            location = locate.locate_trace(path)
        except (locate.TraceError, OSError):
            return  # the read reports it
        requested = Path(path).absolute()
        run_dir = location.run_dir.absolute() if location.run_dir is not None else None
        if len(location.host_files) != 1 or (run_dir is not None and requested in run_dir.parents):
            return
        self.close_begun()
        self._begun = wire.begin(location.xplane, READ_STATS, READ_NUMBERS, self.child)

    def take_begun(self, path, wanted_stat_names, number_stat_names=()):
        """The decode `begin_reading` began, for this unchanged file and these names (`xplane_wire.Begun`), or None."""
        begun = self._begun
        if begun is None or not begun.matches(path, wanted_stat_names, number_stat_names):
            return None
        self._begun = None
        return begun

    def close_begun(self) -> None:
        if self._begun is not None:
            self._begun.close()
            self._begun = None

    def start_plots(self) -> None:
        """Fork the plot helper now (it waits for a free core to import matplotlib)."""
        if self.plots is None:
            from analysis.parallel import plots

            self.plots = plots.start(self.child)
            if self.plots is not None:
                self._waiting.append(self.plots.go)

    def draw(self, jobs) -> Callable[[], list]:
        """Begin drawing the plots `jobs` names (`outputs.write_outputs`): by the helper where there is one,
        else here when waited for."""
        from analysis.parallel import plots

        # Kept until closed: a write that fails before the plots are waited for still ends the helper.
        return self.plots.draw(jobs) if self.plots is not None else lambda: plots.draw_here(jobs)

    def core_free(self) -> None:
        waiting, self._waiting = self._waiting, []
        for start in waiting:
            start()

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """End every child still running (a decode begun and not read, a plot helper not used)."""
        self.close_begun()
        if self.plots is not None:
            self.plots.close()
            self.plots = None
        self._waiting = []
