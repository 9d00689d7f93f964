"""Where a job's per-worker analyses run: any `concurrent.futures.Executor`.

The pipeline hands each worker's trace to one task and gets back the first worker's analysis and
a summary of each other one (`job.WorkerSummary`: a few columns of its steady steps, its means),
never their events, so the client's memory grows by little per worker. Without an executor, a local process pool (or this process, for
small traces) runs them; `dask_executor(address)` runs them on a Dask cluster, each task reading
its trace where it lies (the path must be readable by the cluster's workers). Dask reschedules
the tasks of a worker process that dies; when the cluster has had no worker for a while, the job's
pending tasks fail instead of waiting for one for ever.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DASK_INSTALL = 'pip install -e ".[cluster]" (or pip install distributed)'
SCHEDULER_TIMEOUT_S = 10.0  # connecting to the scheduler, waiting for its first worker, and for one to come back
WATCH_INTERVAL_S = 0.5  # how often the cluster's workers are counted while tasks are pending
DASK_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")  # Dask's connections between machines
ADDRESS_EXAMPLE = "write tcp://HOST:PORT, e.g. tcp://127.0.0.1:8786"


class SchedulerError(RuntimeError):
    """No Dask cluster to run on: not installed, a bad address, no answer, no worker, or a path the
    workers cannot see. The message is one line."""


class LostWorkers(SchedulerError):
    """The cluster lost its workers while the job's tasks were pending, and none came back."""


def check_address(address: str) -> str:
    """`address` as Dask reads it (`tcp://host:port`, or `host:port`); SchedulerError saying what is
    wrong with it, before any connection is tried (an http:// address is the dashboard's)."""
    text = address.strip()
    if not text:
        raise SchedulerError(f"{address!r} is empty: {ADDRESS_EXAMPLE}")
    scheme, sep, location = text.partition("://")
    if not sep:
        scheme, location = "tcp", text
    scheme = scheme.lower()
    if scheme in ("http", "https"):
        raise SchedulerError(
            f"{address!r} is a web address; a Dask scheduler listens on tcp:// (the dashboard's "
            f"address is not the scheduler's): {ADDRESS_EXAMPLE}"
        )
    if scheme not in DASK_SCHEMES:
        raise SchedulerError(
            f"{address!r}: Dask has no {scheme}:// connections (it has "
            f"{', '.join(s + '://' for s in DASK_SCHEMES)}): {ADDRESS_EXAMPLE}"
        )
    host, colon, port = location.rpartition(":")
    if not colon or not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise SchedulerError(f"{address!r} is not HOST:PORT: {ADDRESS_EXAMPLE}")
    return text


@dataclass(frozen=True)
class WorkerFailure:
    """A worker whose files could not be analysed (cut or unreadable trace, broken run.json)."""

    path: Path
    message: str  # one line
    error: BaseException | None = field(default=None, compare=False)  # raised again when no worker can be analysed


def run_all(
    task: Callable[..., Any],
    calls: Sequence[tuple],
    executor: Executor | None,
    keep: Callable[[int, Any], Any] | None = None,
) -> list:
    """`task(*call)` for every call, in order; on `executor` when given (submitted all at once, so
    the cluster can spread them), else one after another here. `keep(index, result)` is what is kept
    of each result as it arrives, and each future is let go once read, so the client holds only that."""
    keep = keep or (lambda _index, result: result)
    if executor is None:
        return [keep(i, task(*call)) for i, call in enumerate(calls)]
    pending = collections.deque(executor.submit(task, *call) for call in calls)
    results: list = []
    while pending:
        results.append(keep(len(results), pending.popleft().result()))
    return results


@contextlib.contextmanager
def local_pool(count: int) -> Iterator[Executor]:
    """A pool of `count` processes, forked where the platform can (no re-import per process)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else methods[0])
    with ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
        yield pool


@contextlib.contextmanager
def dask_executor(address: str, timeout_s: float | None = None, paths: Sequence[str | Path] = ()) -> Iterator[Executor]:
    """An executor on the Dask scheduler at `address` (`tcp://host:8786`); `SchedulerError` when
    Dask is not installed, the address is not one, the scheduler does not answer within `timeout_s`,
    it has no worker, or one of its workers cannot see one of `paths` (absolute: the ones the tasks
    will read). `LostWorkers` when the cluster has had no worker for `timeout_s` while tasks wait."""
    try:
        address = check_address(address)
    except SchedulerError as exc:
        raise SchedulerError(f"Dask scheduler address {exc}") from None
    try:
        import distributed
    except ImportError:
        raise SchedulerError(f"--scheduler needs Dask's distributed package: {DASK_INSTALL}") from None
    timeout_s = SCHEDULER_TIMEOUT_S if timeout_s is None else timeout_s
    # Its connection retries and shutdown chatter are not the user's (Dask sets some of its loggers' levels).
    names = ["distributed", *(name for name in logging.root.manager.loggerDict if name.startswith("distributed."))]
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        client = _connect(distributed, address, timeout_s)
        try:
            try:
                client.wait_for_workers(1, timeout=timeout_s)
            except Exception:
                raise SchedulerError(
                    f"the Dask scheduler at {address} has no worker (waited {timeout_s:g} s): "
                    "start some with 'dask worker " + address + "'"
                ) from None
            _check_paths(client, address, paths)
            executor = _WatchedExecutor(client, address, timeout_s)
            try:
                yield executor
            except CancelledError:
                if executor.lost is not None:
                    raise LostWorkers(executor.lost) from None
                if client.status != "running":  # the client cancels every task when it loses the scheduler
                    raise LostWorkers(
                        f"lost the Dask scheduler at {address} while the job's tasks ran (it "
                        "stopped, or its host cannot be reached)"
                    ) from None
                raise
            except distributed.KilledWorker as exc:  # a task whose every worker died running it
                last, count = getattr(exc.last_worker, "address", exc.last_worker), exc.allowed_failures + 1
                raise LostWorkers(
                    f"{count} Dask worker{'s' if count != 1 else ''} died running one task of the job "
                    f"(the last: {last}), and Dask gave it up; their logs say why"
                ) from None
            finally:
                executor.shutdown(wait=False)
        finally:
            client.close()
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _check_paths(client: Any, address: str, paths: Sequence[str | Path]) -> None:
    """SchedulerError naming the Dask workers that cannot see one of `paths`: each task reads its
    worker's files where they lie, at the same path on every Dask worker."""
    for path in paths:
        seen = client.run(os.path.exists, str(path), on_error="ignore")  # a worker that just left says nothing
        blind = sorted(worker for worker, exists in seen.items() if not exists)
        if blind:
            named = ", ".join(blind[:3]) + (f" and {len(blind) - 3} more" if len(blind) > 3 else "")
            raise SchedulerError(
                f"{len(blind)} of {len(seen)} Dask worker{'s' if len(seen) != 1 else ''} at "
                f"{address} cannot see {path} ({named}): every Dask worker reads the job's files at "
                "the path this machine does; put them on storage every worker mounts at that path "
                "(NFS, a mounted bucket)"
            )


class _WatchedExecutor(Executor):
    """Dask's executor, and a thread that fails the pending tasks once the cluster has had no worker for
    `grace_s`: Dask keeps a task whose workers all died waiting for a new one, for ever."""

    def __init__(self, client: Any, address: str, grace_s: float):
        self._inner = client.get_executor(pure=False)
        self._client, self._address, self._grace_s = client, address, grace_s
        self._pending: set[Future] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.lost: str | None = None  # why the pending tasks were cancelled
        self._watcher = threading.Thread(target=self._watch, name="devprof-dask-watch", daemon=True)
        self._watcher.start()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        if self.lost is not None:
            raise LostWorkers(self.lost)
        future = self._inner.submit(fn, *args, **kwargs)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future) -> None:
        with self._lock:
            self._pending.discard(future)

    def _workers(self) -> int:
        try:
            return len(self._client.nthreads(callback_timeout=max(1.0, self._grace_s / 2)))
        except Exception:  # noqa: BLE001 - a scheduler that does not answer has no worker to give
            return 0

    def _watch(self) -> None:
        since = None  # when the cluster was first seen without a worker
        while not self._stop.wait(WATCH_INTERVAL_S):
            with self._lock:
                waiting = len(self._pending)
            if not waiting:
                since = None
                continue
            now = time.monotonic()
            if self._workers():
                since = None
                continue
            since = now if since is None else since
            if now - since >= self._grace_s:
                self.lost = (
                    f"the Dask cluster at {self._address} lost its last worker, and none came back within "
                    f"{self._grace_s:g} s; {waiting} of the job's tasks were not done (start workers with "
                    f"'dask worker {self._address}' and analyse again)"
                )
                with self._lock:
                    pending = list(self._pending)
                for future in pending:
                    future.cancel()
                return

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._stop.set()
        self._inner.shutdown(wait=wait)


def _connect(distributed: Any, address: str, timeout_s: float) -> Any:
    """A client of the scheduler at `address`, or SchedulerError after `timeout_s`. The client is made in
    a thread of its own: one that accepts the connection and never answers holds `Client()` past its
    own timeout."""
    made: dict[str, Any] = {}

    def connect() -> None:
        # Made in two steps to hold the client when its start fails: left to the garbage collector, its
        # clean-up at exit waits 20 s for a loop that has stopped, then prints a traceback.
        client = distributed.Client.__new__(distributed.Client)
        try:
            client.__init__(address, timeout=timeout_s, set_as_default=False)
            made["client"] = client
        except Exception as exc:  # OSError, TimeoutError, ValueError for a bad address, ...
            made["error"] = exc
            with contextlib.suppress(Exception):
                client.close(timeout=1)

    thread = threading.Thread(target=connect, name="devprof-dask-connect", daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    if "client" in made:
        return made["client"]
    error = made.get("error")
    reason = (str(error).splitlines()[0] or type(error).__name__) if error is not None else "it does not answer"
    if error is None or isinstance(error, OSError):
        raise SchedulerError(f"no Dask scheduler answers at {address} within {timeout_s:g} s: {reason}")
    raise SchedulerError(f"cannot connect to a Dask scheduler at {address}: {reason}")  # its address or TLS setup
