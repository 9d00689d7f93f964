"""The device's achievable FLOP rate and memory bandwidth, measured with TensorFlow (`devprof peak`).

The peak is what *this* TensorFlow build reaches on *this* device, not the datasheet
number, and it must be a rate no real program beats, or every MFU figure is inflated:
square matmuls (FLOP = 2 n^3 each) chained inside one `tf.function` on all of
TensorFlow's threads, at growing sizes until the next size adds less than 3 % (or one
matmul would take longer than `max_op_s`). At each size: a warm-up call, then as many
chained matmuls as take `min_time_s`, timed `repeats` times; the best rate over every
size and repeat. The same search over 3x3 convolutions of growing channel counts, since
a library's convolution kernels can outrun its matmul (oneDNN's on an AVX2 EPYC: 216
against 186 GFLOP/s); the peak is the better of the two. The same for bfloat16 and
float16 where the device runs them fast, and a large elementwise update (bytes read +
written per second). Beside that matrix ceiling, a vector ceiling per dtype: chains of K
multiply-adds per element over an array larger than the caches, fused by XLA into one
kernel, K growing until the rate stops growing. `ceilings` gathers the three per dtype for
the roofline. docs/peak.md says how and why.

Results are cached per device in `~/.cache/devprof/peak-<device-id>.json`
(`DEVPROF_CACHE_DIR` overrides the folder): the device id is the CPU model or GPU name.
`devprof run --measure-peak` stores the same dict in run.json under `peak`, where
`devprof compare` finds it to report model FLOPs utilization.

TensorFlow is imported only inside the TensorFlow runners; the timing and FLOP
accounting take any runner and clock, so tests check them with stubs.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, TypedDict

DEFAULT_DTYPES = {"cpu": ("float32", "bfloat16"), "gpu": ("float32", "bfloat16", "float16")}
# Where the rate stops growing ends the search; these are only the candidates.
# A CPU's matmul rate can stall from 512 to 1024 and still gain 10 % by 4096 (AMD EPYC): the search
# starts where the stall is past.
DEFAULT_SIZES = {"cpu": (1024, 2048, 4096, 8192), "gpu": (1024, 2048, 4096, 8192, 16384)}
BANDWIDTH_BYTES = {"cpu": 512 * 2**20, "gpu": 512 * 2**20}  # well past any last-level cache
# The convolution probe: a batch of CONV_BATCH images of CONV_HW x CONV_HW, 3x3, stride 1, as many
# output as input channels; the channel count grows like a matmul's size.
CONV_CHANNELS = {"cpu": (64, 128, 256, 512), "gpu": (128, 256, 512, 1024)}
CONV_BATCH = 32
CONV_HW = 16
GROWTH = 0.03  # a size that adds less than this over the best so far ends the search
MIN_TIME_S = 0.2  # one timed call: long enough that dispatch and timer noise are under 1 %
MAX_OP_S = 4.0  # a size whose one matmul would take longer is not tried
REPEATS = 5
MIN_REPEATS = 3  # a size's timed calls stop at 3 once they have taken SIZE_BUDGET_S
SIZE_BUDGET_S = 4.0
# Each dtype's best size (and the size its search stopped at) timed again, the dtypes in turn: measured one
# after the other, a burst of load on one dtype's search set their ratio (an AMD EPYC: bfloat16 214 against
# float32 236 GFLOP/s one day, 239 against 117 an hour later), and precision advice reads that ratio.
CONFIRM_ROUNDS = 3
# 2: sizes grow until the rate stops growing (format 1 stopped at the first slow size and
# could sit below what training reached), so older cached peaks are measured again.
# 3: measured with oneDNN's kernels where devprof run trains with them (`cpu_kernels`).
# 4: convolutions too (`peak_flops_per_second`: the better of matmul and conv).
PEAK_FORMAT_VERSION = 5  # 5: the vector ceiling and `ceilings`; bfloat16 only on CPUs with bfloat16 units
# The vector probe: K multiply-adds per element and pass, K growing like a matmul's size. They run
# as up to VECTOR_LANES independent chains per element, summed at the end: one dependent chain is
# bound by the multiply-add's latency, not its throughput (a 2-core EPYC: 34 GFLOP/s at K = 64 in
# one chain, 87 in 8).
VECTOR_CHAINS = {"cpu": (1, 4, 16, 64, 256), "gpu": (1, 4, 16, 64, 256, 1024)}
VECTOR_LANES = 8
VECTOR_MAX_OP_S = 1.0  # a K whose one pass over the array would take longer is not tried
ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}

Runner = Callable[[int], None]  # run(iters): do `iters` chained operations and wait for the result


class Timing(TypedDict):
    """How `measure_rate` times each size."""

    repeats: int
    min_time_s: float
    max_op_s: float
    clock: Callable[[], float]


class Confirming(TypedDict):
    """How `confirm_rates` times the best sizes again."""

    rounds: int
    repeats: int
    min_time_s: float
    clock: Callable[[], float]


def matmul_flops(n: int, iters: int = 1) -> int:
    """FLOPs of `iters` square n x n matmuls: 2 n^3 each (one multiply and one add per term)."""
    return 2 * n**3 * iters


def conv_flops(channels: int, iters: int = 1) -> int:
    """FLOPs of `iters` convolutions of the probe's shape: 2 per multiply-add of a direct 3x3 convolution."""
    return 2 * CONV_BATCH * CONV_HW * CONV_HW * 9 * channels * channels * iters


def vector_lanes(k: int) -> int:
    """The independent chains the probe's K multiply-adds per element run in (each K / lanes deep)."""
    return math.gcd(int(k), VECTOR_LANES)


def vector_flops(k: int, elements: int, iters: int = 1) -> int:
    """FLOPs of `iters` passes of the vector probe over `elements`: 2 per multiply-add, plus, where the
    chains are several, the sum of their results (lanes - 1 adds) and its scaling (1 multiply)."""
    lanes = vector_lanes(k)
    return (2 * int(k) + (lanes if lanes > 1 else 0)) * int(elements) * iters


def vector_coefficients(lanes: int) -> list[tuple[float, float]]:
    """(a, b) of each chain's `x * a + b`: a + b < 1 and both positive keep x in [0, 1] in every dtype,
    and unequal pairs keep a compiler from merging the chains. Exact in bfloat16 and float16."""
    return [(0.5 - j / 64, 0.25 + j / 128) for j in range(lanes)]


def vector_chain(x, k: int, coefficients):
    """One pass of the probe over `x` (a tensor or an array): K multiply-adds per element in
    len(coefficients) chains, averaged. `coefficients` are scalars of x's dtype."""
    lanes = len(coefficients)
    depth = int(k) // lanes
    results = []
    for a, b in coefficients:
        y = x
        for _ in range(depth):
            y = y * a + b
        results.append(y)
    if lanes == 1:
        return results[0]
    total = results[0]
    for y in results[1:]:
        total = total + y
    return total * (1.0 / lanes)


def copy_bytes(nbytes: int, iters: int = 1) -> int:
    """Bytes moved by `iters` in-place updates `v += ones` of `nbytes` tensors: each reads both and writes `v`."""
    return 3 * nbytes * iters


def time_call(run: Runner, iters: int, clock: Callable[[], float]) -> float:
    began = clock()
    run(iters)
    return clock() - began


def best_time(
    run: Runner,
    *,
    repeats: int = REPEATS,
    min_time_s: float = MIN_TIME_S,
    max_iters: int = 1 << 20,
    min_repeats: int = MIN_REPEATS,
    budget_s: float = SIZE_BUDGET_S,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[int, float]:
    """(iters, best seconds): grow `iters` until one call takes `min_time_s`, then best of `repeats` such calls
    (of `min_repeats` where those already took `budget_s`: one big matmul on a slow CPU takes seconds).

    The caller has warmed `run` up already (tracing, first allocation).
    """
    iters = 1
    seconds = time_call(run, iters, clock)
    while seconds < min_time_s and iters < max_iters:
        # Straight to the count that should take min_time_s, at least doubling.
        wanted = math.ceil(min_time_s / max(seconds, 1e-9) * iters) if seconds > 0 else 2 * iters
        iters = min(max_iters, max(2 * iters, wanted))
        seconds = time_call(run, iters, clock)
    spent, done = seconds, 1
    while done < repeats and (done < min_repeats or spent < budget_s):
        call = time_call(run, iters, clock)
        seconds, spent, done = min(seconds, call), spent + call, done + 1
    return iters, seconds


def measure_rate(
    make_runner: Callable[[int], Runner],
    sizes,
    work: Callable[[int, int], float],
    *,
    repeats: int = REPEATS,
    min_time_s: float = MIN_TIME_S,
    max_op_s: float = MAX_OP_S,
    growth: float = GROWTH,
    clock: Callable[[], float] = time.perf_counter,
) -> dict:
    """Best `work(size, iters) / seconds` over sizes that grow until the rate stops growing.

    Sizes are tried in order; the search stops at the first size whose rate is less than
    `1 + growth` times the best so far (`stopped: "growth"`), before a size whose single
    operation would take over `max_op_s` (`"time"`, predicted from the last one by its
    work), or when the sizes run out (`"sizes"`). Returns `{"per_second", "size", "iters",
    "seconds", "stopped", "sizes": [{"size", "iters", "seconds", "per_second"}]}`, the
    best row being the best over every size and repeat.
    """
    sizes = list(sizes)
    tried, best, best_run, stopped = [], None, None, "sizes"
    for index, size in enumerate(sizes):
        run = make_runner(size)
        run(1)  # warm-up: trace, compile, allocate
        iters, seconds = best_time(run, repeats=repeats, min_time_s=min_time_s, clock=clock)
        seconds = max(seconds, 1e-12)
        row = {"size": int(size), "iters": iters, "seconds": seconds, "per_second": work(size, iters) / seconds}
        tried.append(row)
        if best is not None and best_run is not None and row["per_second"] < (1 + growth) * best["per_second"]:
            # Timed seconds apart, a busy moment can fall on one size only: the stop is decided on
            # timings of both taken in turns.
            _retime_in_turns([(best, best_run), (row, run)], work, clock)
            if row["per_second"] < (1 + growth) * best["per_second"]:
                best = max(best, row, key=lambda r: r["per_second"])
                stopped = "growth"
                break
        best, best_run = row, run
        if index + 1 < len(sizes):
            next_op_s = seconds / iters * work(sizes[index + 1], 1) / work(size, 1)
            if next_op_s > max_op_s:
                stopped = "time"
                break
    if best is None:
        raise ValueError("no sizes to measure")
    return {**best, "stopped": stopped, "sizes": tried}


def _retime_in_turns(
    rows: list[tuple[dict, Runner]],
    work: Callable[[int, int], float],
    clock: Callable[[], float],
    rounds: int = CONFIRM_ROUNDS,
) -> None:
    """Time each row's runner at its `iters` again, the rows in turn, `rounds` times in alternating
    order; a faster call replaces a row's `seconds` and `per_second`."""
    for index in range(rounds):
        for row, run in rows if index % 2 == 0 else rows[::-1]:
            seconds = max(time_call(run, row["iters"], clock), 1e-12)
            if seconds < row["seconds"]:
                row.update(seconds=seconds, per_second=work(row["size"], row["iters"]) / seconds)


def confirm_rates(
    make_runners: dict[str, Callable[[int], Runner]],
    results: dict[str, dict],
    work: Callable[[int, int], float],
    *,
    rounds: int = CONFIRM_ROUNDS,
    repeats: int = REPEATS,
    min_time_s: float = MIN_TIME_S,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Time each dtype's best size, and the size its search stopped at, again: the dtypes in turn, `rounds`
    times, in alternating order, so that the machine's load weighs on every dtype alike. A better rate
    replaces the search's; `results[dtype]["confirmed"]` lists every timing."""
    runs = {}
    for dtype, result in results.items():
        sizes = [result["size"]]
        if result["stopped"] == "growth" and result["sizes"][-1]["size"] != result["size"]:
            sizes.append(result["sizes"][-1]["size"])
        for size in sizes:
            run = make_runners[dtype](size)
            run(1)
            runs[(dtype, size)] = run
    order = list(runs)
    for index in range(rounds):
        for dtype, size in order if index % 2 == 0 else order[::-1]:
            iters, seconds = best_time(runs[(dtype, size)], repeats=repeats, min_time_s=min_time_s, clock=clock)
            seconds = max(seconds, 1e-12)
            rate = work(size, iters) / seconds
            result = results[dtype]
            result.setdefault("confirmed", []).append({"size": int(size), "per_second": rate})
            if rate > result["per_second"]:
                result.update(per_second=rate, size=int(size), iters=iters, seconds=seconds)


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


def tf_conv_runner(device: str, dtype: str) -> Callable[[int], Runner]:
    """`make(channels)` -> `run(iters)`: `iters` chained 3x3 convolutions (NHWC, stride 1, same padding).

    The filter is the identity at its centre tap (zeros elsewhere), so values stay bounded; a dense
    convolution kernel multiplies the zeros all the same."""
    import numpy as np
    import tensorflow as tf

    tf_dtype = tf.as_dtype(dtype)

    def make(channels: int) -> Runner:
        kernel = np.zeros((3, 3, channels, channels), np.float32)
        kernel[1, 1] = np.eye(channels, dtype=np.float32)
        with tf.device(_tf_device(device)):
            x0 = tf.cast(tf.random.stateless_uniform((CONV_BATCH, CONV_HW, CONV_HW, channels), seed=(1, 2)), tf_dtype)
            w = tf.cast(tf.constant(kernel), tf_dtype)

        @tf.function
        def chain(iters):
            x = x0
            for _ in tf.range(iters):
                x = tf.nn.conv2d(x, w, strides=1, padding="SAME")
            return x[0, 0, 0, 0]

        def run(iters: int) -> None:
            with tf.device(_tf_device(device)):
                chain(tf.constant(iters)).numpy()

        return run

    return make


def tf_copy_runner(device: str) -> Callable[[int], Runner]:
    """`make(nbytes)` -> `run(iters)`: `iters` in-place `v += ones` over float32 tensors of `nbytes`.

    In place: `x = x + 1` allocated a new tensor each time, and the page faults of 512 MiB
    made the figure swing from 2 to 37 GB/s on one machine."""
    import tensorflow as tf

    def make(nbytes: int) -> Runner:
        with tf.device(_tf_device(device)):
            target = tf.Variable(tf.zeros((nbytes // 4,), tf.float32))
            ones = tf.ones((nbytes // 4,), tf.float32)

        @tf.function
        def update(iters):
            for _ in tf.range(iters):
                target.assign_add(ones)
            return target[0]

        def run(iters: int) -> None:
            with tf.device(_tf_device(device)):
                update(tf.constant(iters)).numpy()

        return run

    return make


def tf_vector_runner(device: str, dtype: str, nbytes: int) -> Callable[[int], Runner]:
    """`make(k)` -> `run(iters)`: `iters` passes of `vector_chain` over a `tf.Variable` of `nbytes`.

    One XLA kernel (`jit_compile=True`) runs the passes in a while loop and writes the variable in
    place: unfused, each multiply and add would be its own pass over memory and the probe would
    measure bandwidth. Where XLA cannot compile it, the same chain runs unfused; `make.fused` is
    False then and `make.fusion_error` says why."""
    import tensorflow as tf

    tf_dtype = tf.as_dtype(dtype)
    with tf.device(_tf_device(device)):
        # Any start in [0, 1] stays there; a fill takes a second where random numbers took five.
        target = tf.Variable(tf.fill((nbytes // tf_dtype.size,), tf.constant(0.5, tf_dtype)))

    def program(k: int, fused: bool, variable):
        with tf.device(_tf_device(device)):
            # Tensors, not Python numbers: the function takes them as inputs, so no compiler folds them.
            chains = [
                (tf.constant(a, tf_dtype), tf.constant(b, tf_dtype)) for a, b in vector_coefficients(vector_lanes(k))
            ]

        if fused:

            @tf.function(jit_compile=True)
            def passes(iters):
                _, x = tf.while_loop(
                    lambda i, x: i < iters,
                    lambda i, x: (i + 1, vector_chain(x, k, chains)),
                    (tf.constant(0), variable.read_value()),
                )
                variable.assign(x)
                return x[0]
        else:

            @tf.function
            def passes(iters):
                for _ in tf.range(iters):
                    variable.assign(vector_chain(variable.read_value(), k, chains))
                return variable[0]

        def run(iters: int) -> None:
            with tf.device(_tf_device(device)):
                passes(tf.constant(iters)).numpy()

        return run

    fused, fusion_error = True, None
    try:  # a small copy first: whether XLA compiles this chain here at all
        with tf.device(_tf_device(device)):
            small = tf.Variable(tf.zeros((1024,), tf_dtype))
        program(VECTOR_LANES, True, small)(1)
    except Exception as exc:  # noqa: BLE001 - the unfused chain still runs, and says so
        fused, fusion_error = False, _failure(exc)

    def make(k: int) -> Runner:
        return program(k, fused, target)

    make.fused = fused  # type: ignore[attr-defined]
    make.fusion_error = fusion_error  # type: ignore[attr-defined]
    return make


def _cpu_kernels(device: str) -> dict | None:
    """Which TensorFlow CPU kernels the matmuls ran on (oneDNN's or Eigen's), as for a run."""
    if device != "cpu":
        return None
    from profiler.device import devices

    return devices.onednn_state()


def device_name(device: str = "cpu") -> str:
    """The CPU model, or the first GPU's name as TensorFlow reports it."""
    from profiler.device import devices

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


def measure_peak(
    device: str = "cpu",
    dtypes=None,
    *,
    sizes=None,
    bandwidth_bytes: int | None = None,
    matmul_runner: Callable[[str, str], Callable[[int], Runner]] | None = None,
    copy_runner: Callable[[str], Callable[[int], Runner]] | None = None,
    conv_runner: Callable[[str, str], Callable[[int], Runner]] | None = None,
    conv_channels=None,
    vector_runner: Callable[[str, str, int], Callable[[int], Runner]] | None = None,
    vector_chains=None,
    vector_max_op_s: float = VECTOR_MAX_OP_S,
    cpu_flags: Callable[[], set[str] | None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    repeats: int = REPEATS,
    min_time_s: float = MIN_TIME_S,
    max_op_s: float = MAX_OP_S,
    growth: float = GROWTH,
    name: str | None = None,
) -> dict:
    """Measure matmul, convolution and vector FLOP/s per dtype, and memory bandwidth, on `device` (``cpu|gpu``).

    A dtype the device cannot run (or, on a CPU, runs without bfloat16 units: `cpu_flags()`,
    /proc/cpuinfo's by default) is recorded under `unsupported` with the reason, not raised; a
    convolution that fails leaves the peak to the matmul (`conv.<dtype>.error`), a vector probe
    that fails leaves that dtype's vector ceiling None (`vector.<dtype>.error`).
    `matmul_runner(device, dtype)`, `conv_runner(device, dtype)`, `vector_runner(device, dtype,
    nbytes)` and `copy_runner(device)` default to the TensorFlow ones; with `clock` they let tests
    check the accounting without timing.
    """
    if device not in DEFAULT_DTYPES:
        raise PeakError(f"peak measures cpu or gpu, not {device!r}")
    dtypes = tuple(dtypes or DEFAULT_DTYPES[device])
    sizes = tuple(sizes or DEFAULT_SIZES[device])
    matmul_runner = matmul_runner or tf_matmul_runner
    conv_runner = conv_runner or tf_conv_runner
    copy_runner = copy_runner or tf_copy_runner
    vector_runner = vector_runner or tf_vector_runner
    conv_channels = tuple(conv_channels or CONV_CHANNELS[device])
    vector_chains = tuple(vector_chains or VECTOR_CHAINS[device])
    began = time.perf_counter()
    timing: Timing = {"repeats": repeats, "min_time_s": min_time_s, "max_op_s": max_op_s, "clock": clock}
    vector_timing: Timing = {**timing, "max_op_s": vector_max_op_s}
    flops, matmul, unsupported = {}, {}, {}
    matmul_results, conv_results = {}, {}
    for dtype in dtypes:
        if device == "cpu" and dtype == "bfloat16":
            reason = _no_bfloat16_units(cpu_flags)
            if reason:
                unsupported[dtype] = reason
                continue
        dtype_began = time.perf_counter()
        try:
            result = measure_rate(matmul_runner(device, dtype), sizes, matmul_flops, growth=growth, **timing)
        except PeakError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unsupported dtype is a fact, not a failure
            unsupported[dtype] = _failure(exc)
            continue
        matmul_results[dtype] = (result, dtype_began)
    if "float32" in dtypes and "float32" not in matmul_results:
        raise PeakError(f"float32 matmul failed on {device}: {unsupported.get('float32')}")
    conv_rates, conv = {}, {}
    for dtype in matmul_results:
        dtype_began = time.perf_counter()
        try:
            result = measure_rate(conv_runner(device, dtype), conv_channels, conv_flops, growth=growth, **timing)
        except Exception as exc:  # noqa: BLE001 - the matmul still bounds the peak from below
            conv[dtype] = {"error": _failure(exc)}
            continue
        conv_results[dtype] = (result, dtype_began)
    if len(matmul_results) > 1:
        confirm: Confirming = {"rounds": CONFIRM_ROUNDS, "repeats": repeats, "min_time_s": min_time_s, "clock": clock}
        confirm_rates(
            {dtype: matmul_runner(device, dtype) for dtype in matmul_results},
            {dtype: result for dtype, (result, _) in matmul_results.items()},
            matmul_flops,
            **confirm,
        )
        confirm_rates(
            {dtype: conv_runner(device, dtype) for dtype in conv_results},
            {dtype: result for dtype, (result, _) in conv_results.items()},
            conv_flops,
            **confirm,
        )
    for dtype, (result, dtype_began) in matmul_results.items():
        flops[dtype] = result["per_second"]
        matmul[dtype] = {**_search_record(result, "n", dtype_began), "confirmed": result.get("confirmed", [])}
    for dtype, (result, dtype_began) in conv_results.items():
        conv_rates[dtype] = result["per_second"]
        conv[dtype] = {**_search_record(result, "channels", dtype_began), "confirmed": result.get("confirmed", [])}
    best = {dtype: max(rate, conv_rates.get(dtype, 0.0)) for dtype, rate in flops.items()}
    nbytes = int(bandwidth_bytes or BANDWIDTH_BYTES[device])
    bandwidth = measure_rate(copy_runner(device), (nbytes,), copy_bytes, **timing)
    vector_rates: dict[str, float] = {}
    vector: dict[str, dict] = {}
    for dtype in flops:
        dtype_began = time.perf_counter()
        try:
            elements = nbytes // ITEMSIZE[dtype]
            make = vector_runner(device, dtype, nbytes)
            result = measure_rate(
                make, vector_chains, lambda k, iters: vector_flops(k, elements, iters), growth=growth, **vector_timing
            )
        except Exception as exc:  # noqa: BLE001 - an unknown vector ceiling is a fact, not a failure
            vector[dtype] = {"error": _failure(exc)}
            continue
        vector[dtype] = {
            **_search_record(result, "k", dtype_began),
            "lanes": vector_lanes(result["size"]),
            "elements": elements,
            "fused": getattr(make, "fused", None),
        }
        from analysis.breakdown.roofline import search_gave_up

        if search_gave_up(vector[dtype]):  # it timed its slowest kernel only: no ceiling
            vector[dtype]["unknown"] = "the search stopped at its first size: too slow to measure a ceiling"
        else:
            vector_rates[dtype] = result["per_second"]
        if getattr(make, "fusion_error", None):
            vector[dtype]["fusion_error"] = make.fusion_error  # type: ignore[attr-defined]
    return {
        "format": PEAK_FORMAT_VERSION,
        "device": device,
        "device_name": name if name is not None else device_name(device),
        "peak_flops_per_second": best,
        "peak_source": {dtype: "conv" if conv_rates.get(dtype, 0.0) > flops[dtype] else "matmul" for dtype in flops},
        "matmul_flops_per_second": flops,
        "conv_flops_per_second": conv_rates,
        "memory_bytes_per_second": bandwidth["per_second"],
        # Bandwidth does not depend on the dtype: the one measurement is every dtype's memory ceiling.
        "ceilings": {
            dtype: {
                "matrix_flops_per_second": best[dtype],
                "vector_flops_per_second": vector_rates.get(dtype),
                "memory_bytes_per_second": bandwidth["per_second"],
            }
            for dtype in flops
        },
        "matmul": matmul,
        "conv": conv,
        "vector": vector,
        "conv_shape": {"batch": CONV_BATCH, "height": CONV_HW, "width": CONV_HW, "kernel": [3, 3]},
        "memory": {"bytes": nbytes, "iters": bandwidth["iters"], "seconds": bandwidth["seconds"]},
        "unsupported": unsupported,
        "threads": _threads(),
        "cpu_kernels": _cpu_kernels(device),
        "method": f"chained square matmuls in one tf.function on all threads, FLOP = 2 n^3; sizes grow until the "
        f"next adds < {growth:.0%} (both timed again in turns before it stops); per size a warm-up, "
        f"then best of {repeats} calls of >= {min_time_s} s; "
        f"the same for chained 3x3 convolutions of growing channel counts (FLOP = 2 per multiply-add); "
        f"then each dtype's best size timed again {CONFIRM_ROUNDS} times, the dtypes in turn; "
        f"the peak is the best over both, sizes and repeats; vector = K multiply-adds per element "
        f"(x * a + b in up to {VECTOR_LANES} independent chains, averaged) over {nbytes} bytes, fused by "
        f"XLA, K growing the same way; bandwidth = float32 v += ones in place, bytes read + written, "
        f"the same for every dtype",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "measure_seconds": time.perf_counter() - began,
        "tensorflow": _tf_version(),
    }


def _no_bfloat16_units(cpu_flags: Callable[[], set[str] | None] | None) -> str | None:
    """Why bfloat16 is not measured on this CPU (it has no bfloat16 units), or None (it has, or its flags are unknown)."""
    from profiler.device import devices

    flags = (cpu_flags or devices.cpu_flags)()
    if flags is None or devices.bfloat16_units(flags):
        return None
    arm = "asimd" in flags  # every 64-bit Arm CPU lists it; no x86 CPU does
    missing = f"the {devices.BF16_ARM_FEATURE} feature" if arm else " or ".join(devices.BF16_X86_FLAGS)
    return f"no bfloat16 units on this CPU: {missing} not in its flags, so TensorFlow emulates bfloat16"


def _search_record(result: dict, size_key: str, began: float) -> dict:
    """One dtype's search for run.json: the best size (under `size_key`) and how the search went."""
    return {
        size_key: result["size"],
        "iters": result["iters"],
        "seconds": result["seconds"],
        "stopped": result["stopped"],
        "sizes": result["sizes"],
        "measure_seconds": time.perf_counter() - began,
    }


def _failure(exc: Exception) -> str:
    """'TypeError: <first line of the message>', short enough for a one-line report."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{type(exc).__name__}: {first[:200]}"


def _threads() -> dict:
    """The CPU threads the measurement could use: TensorFlow's intra-op pool (0 = one per core) and the cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = {"cores": cores}
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        try:
            threads["intra_op"] = tf.config.threading.get_intra_op_parallelism_threads()
        except Exception:  # noqa: BLE001 - a fact for the record, never a failure
            pass
    return threads


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
            if cached.get("format") == PEAK_FORMAT_VERSION and cached.get("peak_flops_per_second"):
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
    return (
        f"the result could not be cached in {cache_dir()} ({cache_error}); it will be measured again next "
        "time (DEVPROF_CACHE_DIR sets the cache folder)"
    )


def peak_for(device: str = "cpu", refresh: bool = False) -> dict:
    """Measure (or reuse the cached) peak of this machine's `device`."""
    name = device_name(device)
    return cached_peak(name, lambda: measure_peak(device, name=name), refresh=refresh)


def cached_for_run(kind: str, name: str | None) -> dict | None:
    """This device's cached peak, when `devprof peak` measured one (None otherwise; never measures or
    raises): every run then carries the ceilings its roofline needs without `--measure-peak`."""
    if kind not in DEFAULT_DTYPES or not name:
        return None
    path = cache_path(name)
    try:
        cached = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
    if (
        not isinstance(cached, dict)
        or cached.get("format") != PEAK_FORMAT_VERSION
        or not cached.get("peak_flops_per_second")
    ):
        return None
    return {**cached, "cache": str(path), "cached": True}


def record_for_run(kind: str, name: str | None = None) -> dict:
    """What `devprof run --measure-peak` stores in run.json `peak`; never raises (a failure is recorded)."""
    if kind not in DEFAULT_DTYPES:
        return {"device": kind, "error": f"peak measures cpu or gpu, not {kind}"}
    try:
        name = name or device_name(kind)
        return cached_peak(name, lambda: measure_peak(kind, name=name))
    except Exception as exc:  # noqa: BLE001 - a peak that cannot be measured must not stop training
        return {"device": kind, "device_name": name, "error": f"{type(exc).__name__}: {exc}"}
