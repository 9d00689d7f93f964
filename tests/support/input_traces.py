"""A traced tf.data loop whose map, behind a prefetch, holds the input wait."""

from __future__ import annotations

from pathlib import Path

from trace_fixtures import ABSOLUTE_BASE_NS, _ns, _Plane, _write_space, _xspace_class

MS = 1_000_000
PY_SLEEP_MS = 50.0  # the injected cost: the map's Python function sleeps this long per batch


def write_prefetched_map_loop(
    path: str | Path,
    *,
    steps: int = 6,
    map_ms: float = 51.8,
    py_ms: float = PY_SLEEP_MS,
    wait_ms: float = 49.9,
    period_ms: float = 52.0,
) -> Path:
    """A CPU loop over `range -> map(py_function) -> batch -> prefetch`, shaped as TensorFlow traced it
    (markers `train` 3.., `period_ms` apart). On the loop's thread each step waits in `IteratorGetNext` for
    `Iterator::Root::Prefetch` (`wait_ms`), then runs a 1 ms step. On the prefetch's producer thread the
    fused `MapAndBatch` makes the next batch (`map_ms`, starting 1.8 ms before the step), pulling from
    `Range` on its runner thread, while its `py_ms` Python function runs on a pool thread. The first
    step's producer call began before the trace did, so it is not in it (as the profiler leaves it)."""
    space = _xspace_class()()
    space.hostnames.append("map-host")
    host = _Plane(space, 0, "/host:CPU")
    base = ABSOLUTE_BASE_NS
    loop, producer = host.line(1, "python", base), host.line(3, "tf_data_prefetch", base)
    runner, pool = host.line(4, "tf_data_map_and_batch", base), host.line(5, "tf_data_pool", base)
    period = _ns(period_ms)
    for k in range(steps):
        t = base + 2 * MS + k * period
        host.event(loop, "train", t, t + period - 50_000, step_num=k + 3, _r=1)
        host.event(loop, "EagerLocalExecute: IteratorGetNext", t + 50_000, t + _ns(wait_ms) + 250_000)
        host.event(loop, "IteratorGetNextOp::DoCompute", t + 100_000, t + _ns(wait_ms) + 200_000)
        host.event(loop, "Iterator::Root", t + 150_000, t + _ns(wait_ms) + 150_000)
        host.event(loop, "Iterator::Root::Prefetch", t + 200_000, t + _ns(wait_ms) + 100_000)
        host.event(
            loop,
            "EagerLocalExecute: __inference_train_step_38",
            t + _ns(wait_ms) + 400_000,
            t + _ns(wait_ms) + 1_400_000,
        )
        made = t + _ns(wait_ms) - _ns(map_ms) + 100_000  # the batch this step waits for is made right then
        if made >= base:
            host.event(producer, "Iterator::Root::Prefetch::MapAndBatch", made, made + _ns(map_ms))
            host.event(runner, "Iterator::Root::Prefetch::MapAndBatch::Range", made + 10_000, made + 15_000)
            host.event(pool, "EagerPyFunc:EagerPyFunc", made + 700_000, made + 700_000 + _ns(py_ms))
    host.finish()
    return _write_space(space, path)
