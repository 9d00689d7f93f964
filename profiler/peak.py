"""The device's achievable matmul rate and memory bandwidth, measured with TensorFlow (`devprof peak`).

The peak is what *this* TensorFlow build reaches on *this* device, not the datasheet
number: square matmuls (FLOP = 2 n^3 each) chained inside one `tf.function` and timed
best-of-N after a warm-up, for float32 and, where the device runs them, bfloat16 and
float16; and a large elementwise update (bytes read + written per second). Sizes grow
until one timed call takes long enough, so the whole measurement stays at a few seconds.

Results are cached per device in `~/.cache/devprof/peak-<device-id>.json`
(`DEVPROF_CACHE_DIR` overrides the folder): the device id is the CPU model or GPU name.
`devprof run --measure-peak` stores the same dict in run.json under `peak`, where
`devprof compare` finds it to report model FLOPs utilization.

TensorFlow is imported only inside the TensorFlow runners; the timing and FLOP
accounting take any runner and clock, so tests check them with stubs.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable

DEFAULT_DTYPES = {"cpu": ("float32", "bfloat16"), "gpu": ("float32", "bfloat16", "float16")}
DEFAULT_SIZES = {"cpu": (256, 512, 1024, 2048), "gpu": (1024, 2048, 4096, 8192)}
BANDWIDTH_BYTES = {"cpu": 512 * 2**20, "gpu": 512 * 2**20}  # well past any last-level cache
PEAK_FORMAT_VERSION = 1

Runner = Callable[[int], None]  # run(iters): do `iters` chained operations and wait for the result


def matmul_flops(n: int, iters: int = 1) -> int:
    """FLOPs of `iters` square n x n matmuls: 2 n^3 each (one multiply and one add per term)."""
    return 2 * n**3 * iters


def copy_bytes(nbytes: int, iters: int = 1) -> int:
    """Bytes moved by `iters` elementwise updates of an `nbytes` tensor: each reads and writes it."""
    return 2 * nbytes * iters


def time_call(run: Runner, iters: int, clock: Callable[[], float]) -> float:
    began = clock()
    run(iters)
    return clock() - began


def best_time(run: Runner, *, repeats: int = 3, min_time_s: float = 0.02, max_iters: int = 4096,
              clock: Callable[[], float] = time.perf_counter) -> tuple[int, float]:
    """(iters, best seconds): double `iters` until one call takes `min_time_s`, then best of `repeats`.

    The caller has warmed `run` up already (tracing, first allocation).
    """
    iters = 1
    seconds = time_call(run, iters, clock)
    while seconds < min_time_s and iters < max_iters:
        iters *= 2
        seconds = time_call(run, iters, clock)
    for _ in range(repeats - 1):
        seconds = min(seconds, time_call(run, iters, clock))
    return iters, seconds


def measure_rate(make_runner: Callable[[int], Runner], sizes, work: Callable[[int, int], float], *,
                 repeats: int = 3, min_time_s: float = 0.02, max_time_s: float = 0.25,
                 clock: Callable[[], float] = time.perf_counter) -> dict:
    """Best `work(size, iters) / seconds` over growing sizes.

    Stops growing once a single operation at some size takes `max_time_s` (bigger ones
    would only make the measurement slow). Returns `{"per_second", "size", "iters",
    "seconds", "sizes": [{"size", "iters", "seconds", "per_second"}]}`.
    """
    tried = []
    for size in sizes:
        run = make_runner(size)
        run(1)  # warm-up: trace, compile, allocate
        iters, seconds = best_time(run, repeats=repeats, min_time_s=min_time_s, clock=clock)
        seconds = max(seconds, 1e-12)
        tried.append({"size": int(size), "iters": iters, "seconds": seconds, "per_second": work(size, iters) / seconds})
        if seconds / iters >= max_time_s:
            break
    if not tried:
        raise ValueError("no sizes to measure")
    best = max(tried, key=lambda row: row["per_second"])
    return {**best, "sizes": tried}


# ---------------------------------------------------------------- TensorFlow runners


def _tf_device(device: str) -> str:
    return "/GPU:0" if device == "gpu" else "/CPU:0"


def tf_matmul_runner(device: str, dtype: str) -> Callable[[int], Runner]:
    """`make(n)` -> `run(iters)`: `iters` chained n x n matmuls on the device, waited for.

    x <- x @ I keeps values bounded in every dtype (a dense GEMM does not skip zeros),
    and the chain makes every matmul depend on the one before, so none is skipped.
    """
    import tensorflow as tf

    tf_dtype = tf.as_dtype(dtype)

    def make(n: int) -> Runner:
        with tf.device(_tf_device(device)):
            a = tf.cast(tf.random.stateless_uniform((n, n), seed=(1, 2)), tf_dtype)
            b = tf.eye(n, dtype=tf_dtype)

        @tf.function
        def chain(iters):
            x = a
            for _ in tf.range(iters):
                x = tf.matmul(x, b)
            return x[0, 0]

        def run(iters: int) -> None:
            with tf.device(_tf_device(device)):
                chain(tf.constant(iters)).numpy()

        return run

    return make


def tf_copy_runner(device: str) -> Callable[[int], Runner]:
    """`make(nbytes)` -> `run(iters)`: `iters` elementwise `x + 1` over a float32 tensor of `nbytes`."""
    import tensorflow as tf

    def make(nbytes: int) -> Runner:
        with tf.device(_tf_device(device)):
            x0 = tf.zeros((nbytes // 4,), tf.float32)

        @tf.function
        def update(iters):
            x = x0
            for _ in tf.range(iters):
                x = x + 1.0
            return x[0]

        def run(iters: int) -> None:
            with tf.device(_tf_device(device)):
                update(tf.constant(iters)).numpy()

        return run

    return make


def device_name(device: str = "cpu") -> str:
    """The CPU model, or the first GPU's name as TensorFlow reports it."""
    from profiler import devices

    if device == "cpu":
        return devices.cpu_model()
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise PeakError("no GPU found (tf.config.list_physical_devices('GPU') is empty)")
    details = {}
    try:
        details = tf.config.experimental.get_device_details(gpus[0])
    except Exception:  # noqa: BLE001
        pass
    return str(details.get("device_name") or gpus[0].name)


class PeakError(Exception):
    """The peak cannot be measured here (no such device): `error: ...`, exit code 2."""


def measure_peak(device: str = "cpu", dtypes=None, *, sizes=None, bandwidth_bytes: int | None = None,
                 matmul_runner: Callable[[str, str], Callable[[int], Runner]] | None = None,
                 copy_runner: Callable[[str], Callable[[int], Runner]] | None = None,
                 clock: Callable[[], float] = time.perf_counter, repeats: int = 3,
                 max_time_s: float = 0.25, name: str | None = None) -> dict:
    """Measure matmul FLOP/s per dtype and memory bandwidth on `device` (``cpu|gpu``).

    A dtype the device cannot run is recorded under `unsupported` with the reason, not
    raised. `matmul_runner(device, dtype)` and `copy_runner(device)` default to the
    TensorFlow ones; with `clock` they let tests check the accounting without timing.
    """
    if device not in DEFAULT_DTYPES:
        raise PeakError(f"peak measures cpu or gpu, not {device!r}")
    dtypes = tuple(dtypes or DEFAULT_DTYPES[device])
    sizes = tuple(sizes or DEFAULT_SIZES[device])
    matmul_runner = matmul_runner or tf_matmul_runner
    copy_runner = copy_runner or tf_copy_runner
    began = time.perf_counter()
    flops, matmul, unsupported = {}, {}, {}
    for dtype in dtypes:
        try:
            result = measure_rate(matmul_runner(device, dtype), sizes, matmul_flops, repeats=repeats,
                                  max_time_s=max_time_s, clock=clock)
        except PeakError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unsupported dtype is a fact, not a failure
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            unsupported[dtype] = f"{type(exc).__name__}: {first[:200]}"
            continue
        flops[dtype] = result["per_second"]
        matmul[dtype] = {"n": result["size"], "iters": result["iters"], "seconds": result["seconds"],
                         "sizes": result["sizes"]}
    if "float32" in dtypes and "float32" not in flops:
        raise PeakError(f"float32 matmul failed on {device}: {unsupported.get('float32')}")
    nbytes = int(bandwidth_bytes or BANDWIDTH_BYTES[device])
    bandwidth = measure_rate(copy_runner(device), (nbytes,), copy_bytes, repeats=repeats, max_time_s=max_time_s,
                             clock=clock)
    return {
        "format": PEAK_FORMAT_VERSION,
        "device": device,
        "device_name": name if name is not None else device_name(device),
        "matmul_flops_per_second": flops,
        "memory_bytes_per_second": bandwidth["per_second"],
        "matmul": matmul,
        "memory": {"bytes": nbytes, "iters": bandwidth["iters"], "seconds": bandwidth["seconds"]},
        "unsupported": unsupported,
        "method": "best of chained square matmuls in a tf.function after warm-up, FLOP = 2 n^3; "
                  "bandwidth = float32 x + 1, bytes read + written",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "measure_seconds": time.perf_counter() - began,
        "tensorflow": _tf_version(),
    }


def _tf_version() -> str | None:
    module = sys.modules.get("tensorflow")
    return getattr(module, "__version__", None) if module else None


# ---------------------------------------------------------------- cache


def device_id(name: str) -> str:
    """A file-name-safe id of a device name.

    'Intel(R) Core(TM) i5-8250U CPU @ 1.60GHz' -> 'intel-r-core-tm-i5-8250u-cpu-1-60ghz'.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "unknown"


def cache_dir() -> Path:
    return Path(os.environ.get("DEVPROF_CACHE_DIR") or Path.home() / ".cache" / "devprof")


def cache_path(name: str) -> Path:
    return cache_dir() / f"peak-{device_id(name)}.json"


def cached_peak(device_name: str, measure_fn: Callable[[], dict], *, refresh: bool = False) -> dict:
    """The cached peak of `device_name`, or `measure_fn()` written to the cache first.

    An unreadable or foreign cache file is measured over. A cache that cannot be written
    is not an error: the fresh measurement is returned with `cache_error` set.
    """
    path = cache_path(device_name)
    if not refresh and path.is_file():
        try:
            cached = json.loads(path.read_text())
            if cached.get("format") == PEAK_FORMAT_VERSION and cached.get("matmul_flops_per_second"):
                return {**cached, "cache": str(path), "cached": True}
        except (OSError, ValueError, AttributeError):
            pass
    result = dict(measure_fn())
    result.setdefault("device_name", device_name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(result, indent=2))
        os.replace(tmp, path)
        result["cache"] = str(path)
    except OSError as exc:
        result["cache_error"] = f"{type(exc).__name__}: {exc}"
    result["cached"] = False
    return result


def not_cached_message(cache_error: str) -> str:
    """What to say when a measured peak could not be written to the cache."""
    return (f"the result could not be cached in {cache_dir()} ({cache_error}); it will be measured again next "
            "time (DEVPROF_CACHE_DIR sets the cache folder)")


def peak_for(device: str = "cpu", refresh: bool = False) -> dict:
    """Measure (or reuse the cached) peak of this machine's `device`."""
    name = device_name(device)
    return cached_peak(name, lambda: measure_peak(device, name=name), refresh=refresh)


def record_for_run(kind: str, name: str | None = None) -> dict:
    """What `devprof run --measure-peak` stores in run.json `peak`; never raises (a failure is recorded)."""
    if kind not in DEFAULT_DTYPES:
        return {"device": kind, "error": f"peak measures cpu or gpu, not {kind}"}
    try:
        name = name or device_name(kind)
        return cached_peak(name, lambda: measure_peak(kind, name=name))
    except Exception as exc:  # noqa: BLE001 - a peak that cannot be measured must not stop training
        return {"device": kind, "device_name": name, "error": f"{type(exc).__name__}: {exc}"}
