"""Real TensorFlow profiler traces with known costs, for the analysis tests.

Each maker trains a tiny CNN on synthetic data under `tf.profiler.experimental` and
returns the log directory it wrote (`<logdir>/plugins/profile/<session>/*.xplane.pb`).
Costs are injected where the breakdown should see them: a sleeping last `tf.data`
stage (input), a sleep in the Python loop inside the step marker (host overhead).
TensorFlow is imported inside the makers so that collecting tests stays cheap.

The `write_*` builders at the end make traces no TensorFlow run here can: GPU (CUDA,
ROCm) and TPU device planes, several hosts in one session, grouped and unrepeated host
traces, written straight as XSpace protobufs with exactly known durations.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

IMAGE_SHAPE = (32, 32, 3)
BATCH_SIZE = 32
NUM_CLASSES = 10


def _tf():
    import tensorflow as tf

    return tf


def small_cnn():
    """A conv model small enough that a CPU step takes a few milliseconds."""
    import keras

    return keras.Sequential(
        [
            keras.Input(IMAGE_SHAPE),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )


def synthetic_dataset(input_delay_ms: float = 0.0, images: int = 256):
    """Pre-batched random images (cheap to fetch); with a delay, a sleeping last stage.

    Prefetch injection and autotuning are off so that the sleep is paid by the
    consumer inside `IteratorGetNext`, not hidden by a background buffer.
    """
    tf = _tf()
    batches = images // BATCH_SIZE
    x = tf.random.stateless_uniform((batches, BATCH_SIZE, *IMAGE_SHAPE), seed=(1, 2))
    y = tf.random.stateless_uniform((batches, BATCH_SIZE), seed=(3, 4), maxval=NUM_CLASSES, dtype=tf.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    if input_delay_ms > 0:
        seconds = input_delay_ms / 1000.0

        def _sleep(images_batch, labels):
            def _block(value):
                time.sleep(seconds)
                return value

            labels = tf.py_function(_block, [labels], labels.dtype)
            labels.set_shape([BATCH_SIZE])
            return images_batch, labels

        ds = ds.map(_sleep)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False
    return ds.with_options(options)


def _train_step_fn(model):
    import keras

    tf = _tf()
    optimizer = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def make_custom_loop_trace(
    logdir: str | Path,
    *,
    steps: int = 8,
    warmup: int = 3,
    input_delay_ms: float = 0.0,
    host_delay_ms: float = 0.0,
    trace_first_step: bool = False,
) -> Path:
    """A `tf.function` train step with one `Trace("train", step_num=N, _r=1)` per step.

    The marker wraps both `next(iterator)` and the step call, as devprof's loop does.
    `host_delay_ms` is Python sleep inside the marker after the step's result is ready.
    With `trace_first_step` the profiler also covers the first call (tracing/compile).
    """
    tf = _tf()
    logdir = Path(logdir)
    model = small_cnn()
    step_fn = tf.function(_train_step_fn(model))
    iterator = iter(synthetic_dataset(input_delay_ms))
    first_profiled = 0 if trace_first_step else warmup
    if not trace_first_step:
        for _ in range(warmup):
            step_fn(*next(iterator)).numpy()
    tf.profiler.experimental.start(str(logdir))
    try:
        for step in range(first_profiled, first_profiled + steps):
            with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
                images, labels = next(iterator)
                step_fn(images, labels).numpy()
                if host_delay_ms > 0:
                    time.sleep(host_delay_ms / 1000.0)
    finally:
        tf.profiler.experimental.stop()
    return logdir


def make_unmarked_loop_trace(
    logdir: str | Path,
    *,
    steps: int = 10,
    warmup: int = 3,
    input_delay_ms: float = 0.0,
    host_delay_ms: float = 0.0,
) -> Path:
    """A custom `tf.function` training loop traced without any step marker.

    No `tf.profiler.experimental.Trace` anywhere: the steps can only be found from the
    repeated calls of the `train_step` function (`__inference_train_step_<n>` on the
    Python thread), as in a trace of any TensorFlow program. Each of the `steps` traced
    iterations is `next(iterator)`, one `train_step` call whose loss is fetched, then
    `host_delay_ms` of Python sleep. `input_delay_ms` is a sleeping last `tf.data` stage
    that prefetching cannot hide (see `synthetic_dataset`); its map function runs on
    tf.data's threads once per batch, as often as the train step, and is not the step.
    The warm-up calls (tracing, first execution) happen before the profiler starts. The
    loop's own timings are written beside the trace (`loop_timings`).
    """
    tf = _tf()
    logdir = Path(logdir)
    model = small_cnn()
    one_step = _train_step_fn(model)

    def train_step(images, labels):
        return one_step(images, labels)

    train_step = tf.function(train_step)
    iterator = iter(synthetic_dataset(input_delay_ms))
    for _ in range(warmup):
        train_step(*next(iterator)).numpy()
    timings: dict[str, list[float]] = {"input_wait_ms": [], "call_ms": [], "host_sleep_ms": []}
    clock = time.perf_counter
    tf.profiler.experimental.start(str(logdir))
    try:
        for _ in range(steps):
            t0 = clock()
            images, labels = next(iterator)
            t1 = clock()
            train_step(images, labels).numpy()
            t2 = clock()
            if host_delay_ms > 0:
                time.sleep(host_delay_ms / 1000.0)
            t3 = clock()
            timings["input_wait_ms"].append((t1 - t0) * 1000.0)
            timings["call_ms"].append((t2 - t1) * 1000.0)
            timings["host_sleep_ms"].append((t3 - t2) * 1000.0)
    finally:
        tf.profiler.experimental.stop()
    (logdir / LOOP_TIMINGS).write_text(json.dumps(timings))
    return logdir


LOOP_TIMINGS = "loop_timings.json"


def loop_timings(logdir: str | Path) -> dict[str, list[float]]:
    """What `make_unmarked_loop_trace`'s loop measured around each traced iteration, in ms.

    `input_wait_ms` (the `next(iterator)` call), `call_ms` (the train step and fetching
    its loss), `host_sleep_ms` (the injected sleep as it really lasted): the ground truth
    of the same run, so a loaded machine moves the expectation with the trace.
    """
    return json.loads((Path(logdir) / LOOP_TIMINGS).read_text())


def make_multi_step_trace(logdir: str | Path, *, calls: int = 4, steps_per_call: int = 4, warmup: int = 2) -> Path:
    """Several train steps per `tf.function` call (a `tf.range` loop), one marker per call.

    The marker carries the global number of the call's first step and a `steps` stat.
    """
    tf = _tf()
    logdir = Path(logdir)
    model = small_cnn()
    step = _train_step_fn(model)
    iterator = iter(synthetic_dataset())

    @tf.function
    def multi_step(n):
        loss = tf.constant(0.0)
        for _ in tf.range(n):
            images, labels = next(iterator)
            loss = step(images, labels)
        return loss

    n = tf.constant(steps_per_call)
    for _ in range(warmup):
        multi_step(n).numpy()
    global_step = warmup * steps_per_call
    tf.profiler.experimental.start(str(logdir))
    try:
        for _ in range(calls):
            with tf.profiler.experimental.Trace("train", step_num=global_step, steps=steps_per_call, _r=1):
                multi_step(n).numpy()
            global_step += steps_per_call
    finally:
        tf.profiler.experimental.stop()
    return logdir


def make_keras_fit_trace(logdir: str | Path, *, profile_batch: tuple[int, int] = (3, 7), steps: int = 10) -> Path:
    """`model.fit` with the Keras TensorBoard callback profiling batches `profile_batch`."""
    import keras

    logdir = Path(logdir)
    model = small_cnn()
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    callback = _profile_only_tensorboard(keras)(log_dir=str(logdir), profile_batch=profile_batch, write_graph=False)
    model.fit(synthetic_dataset(), steps_per_epoch=steps, epochs=1, callbacks=[callback], verbose=0, shuffle=False)
    return logdir


class _SummaryWithoutScalars:
    """`tf.summary` with the calls that need the `tensorboard` package made no-ops."""

    def __init__(self, summary):
        self._summary = summary

    def __getattr__(self, name):
        if name in {"scalar", "trace_on", "trace_export", "graph", "histogram", "image"}:
            return lambda *args, **kwargs: None
        return getattr(self._summary, name)


def _profile_only_tensorboard(keras):
    """Keras' TensorBoard callback keeping its profiling and dropping scalar summaries.

    The profiler markers (`Profiled batch`) and the trace are the callback's own; only
    summaries are dropped, since they need the `tensorboard` package, which a test
    environment may lack.
    """

    tensorboard: Any = keras.callbacks.TensorBoard  # of the Keras module the caller passes in

    class ProfileOnlyTensorBoard(tensorboard):
        @property
        def summary(self):
            import tensorflow as tf

            return _SummaryWithoutScalars(tf.summary)

    return ProfileOnlyTensorBoard


def find_xplane(logdir: str | Path) -> Path:
    """The newest `.xplane.pb` the profiler wrote under `logdir`."""
    found = sorted(Path(logdir).glob("**/plugins/profile/*/*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no .xplane.pb under {logdir}")
    return found[-1]


INPUT_DELAY_MS = 30.0
HOST_DELAY_MS = 30.0
# The loop traced without step markers: how many train_step calls are traced, and its costs.
UNMARKED_STEPS = 10
UNMARKED_INPUT_DELAY_MS = 40.0
UNMARKED_HOST_DELAY_MS = 30.0

_MAKERS = {
    "clean": lambda d: make_custom_loop_trace(d),
    "input_delay": lambda d: make_custom_loop_trace(d, input_delay_ms=INPUT_DELAY_MS),
    "host_delay": lambda d: make_custom_loop_trace(d, host_delay_ms=HOST_DELAY_MS),
    "first_step": lambda d: make_custom_loop_trace(d, steps=3, trace_first_step=True),
    "multi_step": lambda d: make_multi_step_trace(d),
    "keras_fit": lambda d: make_keras_fit_trace(d),
    "nomarker_clean": lambda d: make_unmarked_loop_trace(d, steps=UNMARKED_STEPS),
    "nomarker_input40": lambda d: make_unmarked_loop_trace(
        d, steps=UNMARKED_STEPS, input_delay_ms=UNMARKED_INPUT_DELAY_MS
    ),
    "nomarker_host30": lambda d: make_unmarked_loop_trace(
        d, steps=UNMARKED_STEPS, host_delay_ms=UNMARKED_HOST_DELAY_MS
    ),
}


@functools.cache
def _trace_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="devprof-traces-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


@functools.cache
def trace_logdir(kind: str) -> Path:
    """The log directory of a trace of `kind`, made once per test process.

    Kinds: clean, input_delay, host_delay, first_step, multi_step, keras_fit (with step
    markers); nomarker_clean, nomarker_input40, nomarker_host30 (no step markers).
    Tests must treat it as read-only (copy it to change it).
    """
    return _MAKERS[kind](_trace_root() / kind)


def _xspace_class():
    from xplane_message import _xplane_module

    return _xplane_module().XSpace


def write_trace_without_markers(path: str | Path) -> Path:
    """A valid one-plane XSpace whose events carry no step_num: a trace with no steps."""
    space = _xspace_class()()
    plane = space.planes.add(id=0, name="/host:CPU")
    plane.event_metadata[1].id = 1
    plane.event_metadata[1].name = "EagerExecute"
    line = plane.lines.add(id=1, name="python", timestamp_ns=1000)
    for i in range(3):
        line.events.add(metadata_id=1, offset_ps=i * 2_000_000, duration_ps=1_000_000)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(space.SerializeToString())
    return path


def write_with_fake_gpu(source: str | Path, path: str | Path, *, copy_ms: float, kernel_ms: float) -> Path:
    """A copy of a real host trace plus a `/device:GPU:0` plane, for code paths needing a GPU.

    For every `train` marker the fake stream holds one `MemcpyHtoD` of `copy_ms`
    followed by back-to-back kernels totalling `kernel_ms`, ending just before the
    marker ends (clear of the host's iterator wait at the marker's start).
    """
    from analysis.read.trace import xspace_to_tables
    from xplane_message import load_xspace

    space = load_xspace(source)
    _, _, events, _ = xspace_to_tables(space)
    markers = events[(events["name"] == "train") & events["step_num"].notna()]
    plane = space.planes.add(id=100, name="/device:GPU:0")
    for key, name in ((1, "MemcpyHtoD"), (2, "volta_sgemm_128x64_nn"), (3, "void Eigen::internal::EigenMetaKernel")):
        plane.event_metadata[key].id = key
        plane.event_metadata[key].name = name
    line = plane.lines.add(id=7, name="Stream #7(Compute,MemcpyHtoD)", timestamp_ns=0)
    copy_ps, half_kernel_ps = int(copy_ms * 1e9), int(kernel_ms * 1e9 / 2)
    for end_ns in markers["end_ns"].astype("int64"):
        offset = int(end_ns) * 1000 - 10_000 - copy_ps - 2 * half_kernel_ps
        line.events.add(metadata_id=1, offset_ps=offset, duration_ps=copy_ps)
        line.events.add(metadata_id=2, offset_ps=offset + copy_ps, duration_ps=half_kernel_ps)
        line.events.add(metadata_id=3, offset_ps=offset + copy_ps + half_kernel_ps, duration_ps=half_kernel_ps)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(space.SerializeToString())
    return path


def write_with_late_executor_tails(source: str | Path, path: str | Path) -> tuple[Path, int]:
    """A copy of a real CPU trace where each step's executor finishes late, as under contention.

    On a busy host an executor thread can be preempted after its done-callback has
    released the caller, so a span linked (`_c`) to a step's `FunctionRun` closes
    inside the next step's marker, over that step's Python and iterator call. Here,
    for every step but the last, a copy of the step's last linked span (same name and
    stats, so the same `_c`) is added on a thread of its own, running from the next
    marker's start through the first half of that marker: the step it belongs to is
    unchanged, and the next step must not gain it. Returns the path and the count added.
    """
    from analysis.read.trace import xspace_to_tables
    from xplane_message import load_xspace

    space = load_xspace(source)
    _, _, events, _ = xspace_to_tables(space)
    events["position"] = events.groupby(["plane", "line"]).cumcount()
    markers = events[(events["name"] == "train") & events["step_num"].notna()].sort_values("start_ns")
    marker_line = markers[["plane", "line"]].iloc[0]
    on_marker_line = (events["plane"] == marker_line["plane"]) & (events["line"] == marker_line["line"])
    plane = space.planes[int(marker_line["plane"])]
    late_line = plane.lines.add(id=max(line.id for line in plane.lines) + 1, name="tf_Compute/late", timestamp_ns=0)
    added = 0
    for (_, this), (_, following) in zip(markers.iterrows(), markers.iloc[1:].iterrows()):
        inside = on_marker_line & (events["start_ns"] >= this["start_ns"]) & (events["start_ns"] < this["end_ns"])
        producers = set(events.loc[inside & events["_p"].notna(), "_p"])
        linked = events[~on_marker_line & events["_c"].isin(producers).fillna(False).astype(bool)]
        if linked.empty:
            continue
        last = linked.loc[linked["end_ns"].idxmax()]
        original = plane.lines[int(last["line"])].events[int(last["position"])]
        start_ns = int(following["start_ns"])
        tail = late_line.events.add()
        tail.CopyFrom(original)
        tail.offset_ps = start_ns * 1000
        tail.duration_ps = (int(following["end_ns"]) - start_ns) // 2 * 1000
        added += 1
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(space.SerializeToString())
    return path, added


# ---------------------------------------------------------------------------------------
# Synthetic traces built straight as XSpace protobufs (no TensorFlow run): device planes
# we do not have here (CUDA, ROCm, TPU), several hosts, grouped and unrepeated traces.
# Every duration is an exact integer number of nanoseconds, so the breakdown is known
# exactly; timestamps are absolute (about 1.8e18 ns, an epoch-based clock), where a float64
# holds only every 256th nanosecond.
# ---------------------------------------------------------------------------------------

ABSOLUTE_BASE_NS = 1_800_000_000_123_456_789
NS_PER_MS = 1_000_000
DERIVED_LINE_ID = 0xDEADBEEF  # XProf's first id for lines derived from a device's own events
PJRT_EXECUTE = "PjRtStreamExecutorLoadedExecutable::Execute"
PROFILE_DIR = Path("plugins") / "profile"
LAUNCHES_PER_STEP = 4  # kernel launch API calls per step and device (the compute kernels and the collective)


def _ns(ms: float) -> int:
    return int(round(ms * NS_PER_MS))


class _Plane:
    """Builds one XPlane: event and stat metadata by name, lines filled from (start, end) in ns."""

    def __init__(self, space, plane_id: int, name: str):
        self.plane = space.planes.add(id=plane_id, name=name)
        self._events: dict[str, int] = {}
        self._stats: dict[str, int] = {}
        self._pending: list[tuple] = []

    def _event_id(self, name: str) -> int:
        if name not in self._events:
            key = len(self._events) + 1
            self.plane.event_metadata[key].id = key
            self.plane.event_metadata[key].name = name
            self._events[name] = key
        return self._events[name]

    def _stat_id(self, name: str) -> int:
        if name not in self._stats:
            key = len(self._stats) + 1
            self.plane.stat_metadata[key].id = key
            self.plane.stat_metadata[key].name = name
            self._stats[name] = key
        return self._stats[name]

    def line(self, line_id: int, name: str, timestamp_ns: int):
        return self.plane.lines.add(id=line_id, name=name, display_name=name, timestamp_ns=timestamp_ns)

    def event(self, line, name: str, start_ns: int, end_ns: int, **stats) -> None:
        """Queue an event on `line` from `start_ns` to `end_ns` (absolute); `finish()` writes them in order."""
        assert end_ns >= start_ns >= line.timestamp_ns, (name, start_ns, end_ns, line.timestamp_ns)
        self._pending.append((line, int(start_ns), int(end_ns), name, stats))

    def finish(self) -> None:
        """Write the queued events, each line's sorted by start (an enclosing event before what it holds)."""
        for line, start, end, name, stats in sorted(self._pending, key=lambda e: (id(e[0]), e[1], -(e[2] - e[1]))):
            event = line.events.add(
                metadata_id=self._event_id(name),
                offset_ps=(start - line.timestamp_ns) * 1000,
                duration_ps=(end - start) * 1000,
            )
            for stat_name, value in stats.items():
                stat = event.stats.add(metadata_id=self._stat_id(stat_name))
                if isinstance(value, str):
                    stat.str_value = value
                elif isinstance(value, float):
                    stat.double_value = value
                else:
                    stat.int64_value = int(value)
        self._pending.clear()


def _write_space(space, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(space.SerializeToString())
    return path


@dataclass(frozen=True)
class SyntheticDeviceTrace:
    """A synthetic trace and what its analysis must find, in ms (means per step)."""

    path: Path
    producer: str
    hostname: str
    steps: int
    step_ms: float  # every step, host and device
    devices: dict  # "/device:GPU:0" -> {step_count, step_ms, compute_ms, input_ms, copy_ms, collective_ms, idle_ms}
    idle_devices: tuple  # device planes without events
    launch_calls: int  # kernel launch API calls in the trace
    launch_ms_per_step: float  # their total duration per step
    double_counted_compute_ms: dict  # per device: what compute would be with the derived lines counted too
    step_name: str = PJRT_EXECUTE


def write_synthetic_device_trace(
    path: str | Path,
    *,
    producer: str = "cuda",
    gpus: int = 4,
    steps: int = 5,
    kernel_ms: float = 6.0,
    h2d_ms: float = 1.5,
    d2d_ms: float = 0.5,
    collective_ms: float = 2.0,
    gap_ms: float = 2.0,
    skew_ms: float = 0.5,
    lead_ms: float = 0.0,
    launch_ms: float = 0.01,
    empty_gpus: int = 1,
    custom_plane: bool = True,
    derived_lines: bool = True,
    steps_line: bool = False,
    stagger_ns: int = 0,
    hostname: str = "synth-host",
    base_ns: int = ABSOLUTE_BASE_NS,
    kernel_name: str = "volta_sgemm_128x64_nn",
) -> SyntheticDeviceTrace:
    """A multi-device XLA/PjRt trace with exactly known per-device parts, written to `path`.

    Host (`/host:CPU`): one `py_xla_execute/<id>` thread per device holding, per step, one
    `PjRtStreamExecutorLoadedExecutable::Execute` (the k-th on every thread is step k; thread
    d starts `d * stagger_ns` late, and all return together when the step's all-reduce
    ends, so the k-th executions span exactly [T_k, T_k + step_ms)) with a nested
    `EnqueueExecution`. Kernel launch API calls (`LAUNCHES_PER_STEP` per step and device,
    `launch_ms` each, never overlapping across threads) sit inside it for CUDA
    (`cuLaunchKernel`) and on `Host Threads/<tid>` lines for ROCm (`hipModuleLaunchKernel`,
    `hipExtModuleLaunchKernel`, `hipLaunchKernel`), beside copy/sync API calls that are
    not launches. TPU has no launches.

    Device d, step k, from the step's start T (`gap_ms` is split in two halves g1, g2;
    K = `kernel_ms + d * skew_ms`; the collective absorbs the skew as a real all-reduce
    does, so every device's step has the same length):

        [0, lead + g1)             idle (`lead_ms`: extra host time before the launch)
        h2d_ms                     host-to-device copy (input)
        K/2 on stream A            compute kernel; a second kernel on stream B overlaps its
                                   second half (the union is K/2)
        g2                         idle between kernels
        K/2 on stream A            compute kernel
        d2d_ms                     device-to-device copy (copy; ROCm: copyBuffer/fillBuffer kernels)
        collective_ms + (G-1-d)*skew  collective kernel (nccl, or all-reduce on TPU), ending at T + step

    GPU planes: CUDA lines `Stream #13(Compute)`, `Stream #14(Compute)`,
    `Stream #15(MemcpyH2D)`; ROCm lines `Stream #1(Kernel)`, `Stream #2`,
    `Stream #4(MemcpyOther)`. With `derived_lines`, the derived `XLA Ops` (one op
    spanning both compute kernels and the idle between them, so counting it would add
    g2), `XLA Modules` (the program over the whole step) and, for CUDA, `TensorFlow Ops`.
    With `steps_line`, a `Steps` line with one event per step (`group_id` = k).
    TPU planes (`/device:TPU:N`) have `XLA Ops` (infeed, fusion, convolution, all-reduce;
    no copies: `d2d_ms` is ignored), `XLA Modules` and, with `steps_line`, `Steps`.
    `kernel_name` names CUDA's first compute kernel (long template names test the renderers).
    `empty_gpus` more device planes without lines follow; `custom_plane` adds a
    `/device:CUSTOM:Megascale Trace` plane with events of its own (never a device).
    """
    if producer not in ("cuda", "rocm", "tpu"):
        raise ValueError(f"unknown producer {producer!r}")
    tpu = producer == "tpu"
    if tpu:
        d2d_ms = 0.0
    kind = "TPU" if tpu else "GPU"
    g1, lead = _ns(gap_ms) // 2, _ns(lead_ms)
    g2 = _ns(gap_ms) - g1
    h2d, d2d, coll, skew, launch = _ns(h2d_ms), _ns(d2d_ms), _ns(collective_ms), _ns(skew_ms), _ns(launch_ms)
    step = lead + g1 + h2d + _ns(kernel_ms) + skew * (gpus - 1) + g2 + d2d + coll
    first_api = 50_000
    api_per_thread = (LAUNCHES_PER_STEP + 3) * launch
    if not tpu and lead + g1 < first_api + gpus * api_per_thread + gpus * stagger_ns:
        raise ValueError("gap_ms too short for the launch calls")
    starts = [base_ns + 5 * NS_PER_MS + k * step for k in range(steps)]

    space = _xspace_class()()
    space.hostnames.append(hostname)
    space.planes.add(id=0, name="/host:metadata")
    expected, double_counted = {}, {}
    correlation = 1000
    launches = []  # (device, step, correlation ids of its kernels and copies)
    for d in range(gpus):
        plane = _Plane(space, d, f"/device:{kind}:{d}")
        K = _ns(kernel_ms) + d * skew
        half1 = K // 2
        half2 = K - half1
        my_coll = coll + skew * (gpus - 1 - d)
        if tpu:
            modules = plane.line(2, "XLA Modules", base_ns)
            ops = plane.line(3, "XLA Ops", base_ns)
            steps_ln = plane.line(1, "Steps", base_ns) if steps_line else None
        else:
            if producer == "cuda":
                stream_a = plane.line(13, "Stream #13(Compute)", base_ns)
                stream_b = plane.line(14, "Stream #14(Compute)", base_ns)
                copies = plane.line(15, "Stream #15(MemcpyH2D)", base_ns)
            else:
                stream_a = plane.line(1, "Stream #1(Kernel)", base_ns)
                stream_b = plane.line(2, "Stream #2", base_ns)
                copies = plane.line(4, "Stream #4(MemcpyOther)", base_ns)
            steps_ln = plane.line(DERIVED_LINE_ID, "Steps", base_ns) if steps_line else None
            if derived_lines:
                modules = plane.line(DERIVED_LINE_ID + 1, "XLA Modules", base_ns)
                ops = plane.line(DERIVED_LINE_ID + 2, "XLA Ops", base_ns)
                tf_ops = plane.line(DERIVED_LINE_ID + 3, "TensorFlow Ops", base_ns) if producer == "cuda" else None
        for k, t in enumerate(starts):
            h2d_at = t + lead + g1
            c = h2d_at + h2d
            k3 = c + half1 + g2
            copy_at = k3 + half2
            coll_at = copy_at + d2d
            assert coll_at + my_coll == t + step
            if steps_ln is not None:
                plane.event(steps_ln, str(k), t, t + step, group_id=k)
            if tpu:
                plane.event(modules, "jit_train_step(7)", t, t + step, program_id=7)
                plane.event(ops, "infeed.3", h2d_at, c)
                plane.event(ops, "fusion.12", c, c + half1)
                plane.event(ops, "convolution.7", k3, k3 + half2)
                plane.event(ops, "all-reduce.4", coll_at, coll_at + my_coll)
                continue
            cid = [correlation + i for i in range(LAUNCHES_PER_STEP + 2)]
            correlation += LAUNCHES_PER_STEP + 2
            if producer == "cuda":
                plane.event(copies, "MemcpyH2D", h2d_at, c, correlation_id=cid[4])
                plane.event(stream_a, kernel_name, c, c + half1, correlation_id=cid[0])
                plane.event(
                    stream_b, "void Eigen::internal::EigenMetaKernel", c + half1 // 2, c + half1, correlation_id=cid[1]
                )
                plane.event(stream_a, "fusion_2", k3, k3 + half2, correlation_id=cid[2])
                plane.event(stream_a, "MemcpyD2D", copy_at, coll_at, correlation_id=cid[5])
                plane.event(
                    stream_b, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", coll_at, t + step, correlation_id=cid[3]
                )
            else:
                plane.event(copies, "CopyHostToDevice", h2d_at, c, correlation_id=cid[4])
                plane.event(
                    stream_a, "Cijk_Ailk_Bljk_BBS_BH_MT256x128x64_MI16x16x16x1", c, c + half1, correlation_id=cid[0]
                )
                plane.event(stream_b, "Im3d2Col.kd", c + half1 // 2, c + half1, correlation_id=cid[1])
                plane.event(stream_a, "input_transpose_fusion.kd", k3, k3 + half2, correlation_id=cid[2])
                fill = d2d // 3
                plane.event(stream_a, "__amd_rocclr_copyBuffer.kd", copy_at, coll_at - fill, correlation_id=cid[5])
                plane.event(stream_a, "__amd_rocclr_fillBuffer.kd", coll_at - fill, coll_at, correlation_id=cid[5])
                plane.event(stream_b, "ncclDevKernel_Generic_4", coll_at, t + step, correlation_id=cid[3])
            if derived_lines:
                plane.event(modules, "jit_train_step", t, t + step)
                plane.event(ops, "fusion.1", c, k3 + half2, hlo_op="fusion.1")
                plane.event(ops, "copy.2", copy_at, coll_at, hlo_op="copy.2")
                plane.event(ops, "all-reduce-start.3", coll_at, t + step, hlo_op="all-reduce-start.3")
                if tf_ops is not None:
                    plane.event(tf_ops, "train_step/dense/MatMul:MatMul", c, k3 + half2)
            launches.append((d, k, cid))
        plane.finish()
        expected[f"/device:{kind}:{d}"] = {
            "step_count": steps,
            "step_ms": step / NS_PER_MS,
            "compute_ms": K / NS_PER_MS,
            "input_ms": h2d / NS_PER_MS,
            "copy_ms": d2d / NS_PER_MS,
            "collective_ms": my_coll / NS_PER_MS,
            "idle_ms": (lead + g1 + g2) / NS_PER_MS,
        }
        double_counted[f"/device:{kind}:{d}"] = (K + g2) / NS_PER_MS
    idle_devices = []
    for i in range(empty_gpus):
        name = f"/device:{kind}:{gpus + i}"
        space.planes.add(id=gpus + i, name=name)
        idle_devices.append(name)
    if custom_plane:
        custom = _Plane(space, 0, "/device:CUSTOM:Megascale Trace")
        dcn = custom.line(1, "Megascale Collectives", base_ns)
        for t in starts:
            custom.event(dcn, "MegaScale: All-Reduce", t + step // 2, t + step)
        custom.finish()

    host = _Plane(space, 0, "/host:CPU")
    launch_calls = 0
    api_lines = {}
    for d in range(gpus):
        thread = host.line(7_000_000 + d, f"py_xla_execute/{-1472503042444199177 + d}", base_ns - 2 * NS_PER_MS + d)
        if producer == "rocm":
            api_lines[d] = host.line(583 + 3 * d, f"Host Threads/{583 + 3 * d}", base_ns - NS_PER_MS)
        for k, t in enumerate(starts):
            begin = t + d * stagger_ns
            host.event(thread, PJRT_EXECUTE, begin, t + step)  # every thread returns when the all-reduce ends
            host.event(
                thread, "PjRtStreamExecutorLoadedExecutable::EnqueueExecution", begin + 10_000, t + lead + g1 - 1_000
            )
            if tpu:
                continue
            cid = next(c for dd, kk, c in launches if dd == d and kk == k)
            api_at = begin + first_api + d * api_per_thread
            if producer == "cuda":
                api_line = thread
                names = ["cuLaunchKernel"] * LAUNCHES_PER_STEP
                others = ["cuMemcpyHtoDAsync_v2", "cuMemcpyDtoDAsync_v2", "cuEventRecord"]
            else:
                api_line = api_lines[d]
                names = [
                    "hipModuleLaunchKernel",
                    "hipExtModuleLaunchKernel",
                    "hipModuleLaunchKernel",
                    "hipLaunchKernel",
                ]
                others = ["hipMemcpyHtoDAsync", "hipMemcpyDtoDAsync", "hipStreamWaitEvent"]
            for j, name in enumerate(names):
                host.event(api_line, name, api_at + j * launch, api_at + (j + 1) * launch, correlation_id=cid[j])
                launch_calls += 1
            for j, name in enumerate(others):
                at = api_at + (LAUNCHES_PER_STEP + j) * launch
                host.event(api_line, name, at, at + launch, correlation_id=cid[4 + min(j, 1)])
    host.finish()
    space.planes.add(id=0, name="Task Environment")
    return SyntheticDeviceTrace(
        path=_write_space(space, path),
        producer=producer,
        hostname=hostname,
        steps=steps,
        step_ms=step / NS_PER_MS,
        devices=expected,
        idle_devices=tuple(idle_devices),
        launch_calls=launch_calls,
        launch_ms_per_step=launch_calls * launch / NS_PER_MS / steps,
        double_counted_compute_ms=double_counted,
    )


@dataclass(frozen=True)
class SyntheticSession:
    """A profile session with one host file per worker, and which worker is slow at what."""

    logdir: Path
    files: tuple  # worker0.xplane.pb, worker1.xplane.pb, ...
    hostnames: tuple  # one per worker, in file order
    slow_worker: int | None
    slow_part: str | None  # "input" or "host"
    extra_ms: float
    step_ms: float  # every worker's step (synchronous)
    input_ms: tuple  # per worker, host-to-device input copies per step
    collective_ms: tuple  # per worker, collective time per step (the wait for the slow worker included)


def write_synthetic_session(
    logdir: str | Path,
    *,
    workers: int = 3,
    slow_worker: int | None = 1,
    slow_part: str = "input",
    extra_ms: float = 6.0,
    steps: int = 5,
    session: str = "2030_01_01_00_00_00",
) -> SyntheticSession:
    """`<logdir>/plugins/profile/<session>/worker<i>.xplane.pb`, one synchronous data-parallel worker each.

    Every worker is a one-GPU CUDA host built by `write_synthetic_device_trace` with the
    same clock and step starts (gap 2, H2D 1.5, kernels 6, D2D 0.5, all-reduce 2 ms per
    step). The slow worker pays `extra_ms` more per step, as input (a longer host-to-device
    copy) or as host time (idle before its launches); the others wait that long in the
    all-reduce, so every worker's step is 12 + `extra_ms` ms and only the slow one's step
    minus its collective wait stands out. With `slow_worker=None` all are equal (12 ms).
    """
    if slow_part not in ("input", "host"):
        raise ValueError(f"slow_part is input or host, not {slow_part!r}")
    folder = Path(logdir) / PROFILE_DIR / session
    base: dict[str, Any] = dict(
        gpus=1,
        steps=steps,
        kernel_ms=6.0,
        h2d_ms=1.5,
        d2d_ms=0.5,
        collective_ms=2.0,
        gap_ms=2.0,
        skew_ms=0.0,
        empty_gpus=0,
        custom_plane=False,
    )
    files, hostnames, inputs, collectives, step_ms = [], [], [], [], None
    for i in range(workers):
        params = dict(base, hostname=f"node-{i}")
        if slow_worker is not None:
            if i == slow_worker:
                params.update(h2d_ms=1.5 + extra_ms) if slow_part == "input" else params.update(lead_ms=extra_ms)
            else:
                params.update(collective_ms=2.0 + extra_ms)
        made = write_synthetic_device_trace(folder / f"worker{i}.xplane.pb", **params)
        row = made.devices["/device:GPU:0"]
        assert step_ms is None or abs(made.step_ms - step_ms) < 1e-9
        step_ms = made.step_ms
        files.append(made.path)
        hostnames.append(made.hostname)
        inputs.append(row["input_ms"])
        collectives.append(row["collective_ms"])
    assert step_ms is not None, "no workers"
    return SyntheticSession(
        Path(logdir),
        tuple(files),
        tuple(hostnames),
        slow_worker,
        slow_part if slow_worker is not None else None,
        extra_ms,
        step_ms,
        tuple(inputs),
        tuple(collectives),
    )


def write_grouped_host_trace(
    path: str | Path,
    *,
    steps: int = 6,
    input_ms: float = 3.0,
    compute_ms: float = 5.0,
    host_ms: float = 2.0,
    base_ns: int = ABSOLUTE_BASE_NS,
) -> Path:
    """A CPU-only trace with no step markers whose events carry XProf's `group_id` stat (= step).

    Step k runs from T_k to T_k + input + compute + host, back to back: on the `python`
    thread `IteratorGetNext` (input) then `EagerExecute` (waiting for the function) and
    `TFE_DeleteTensorHandle` ending the step; on a `tf_Compute` thread
    `ExecutorState::Process` (compute) nested in the wait. Every event of step k has
    `group_id` k; a setup event before the first step has none. No event name says
    tf.function or XLA program, and none has `step_num`.
    """
    space = _xspace_class()()
    space.hostnames.append("grouped-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", base_ns)
    worker = host.line(101, "tf_Compute/5753299056142092772", base_ns)
    step = _ns(input_ms) + _ns(compute_ms) + _ns(host_ms)
    first = base_ns + 10 * NS_PER_MS
    host.event(python, "ProfilerSession::Start", base_ns + NS_PER_MS, base_ns + 2 * NS_PER_MS)
    for k in range(steps):
        t = first + k * step
        got = t + _ns(input_ms)
        done = got + _ns(compute_ms)
        host.event(python, "IteratorGetNext", t, got, group_id=k)
        host.event(python, "EagerExecute", got, done, group_id=k)
        host.event(worker, "ExecutorState::Process", got + 100_000, done - 100_000, group_id=k)
        host.event(python, "TFE_DeleteTensorHandle", done, t + step, group_id=k)
    host.finish()
    return _write_space(space, path)


def write_unrepeated_trace(path: str | Path, *, base_ns: int = ABSOLUTE_BASE_NS) -> Path:
    """A CPU-only trace where nothing repeats: no markers, no groups, no function called twice.

    `python`: `ImportModules` [0, 5) ms, `IteratorGetNext` [5, 15) (input, 10 ms),
    `EagerExecute` [15, 55), `SaveCheckpoint` [60, 80); `tf_Compute`:
    `ExecutorState::Process` [16, 54). The whole trace is 80 ms.
    """
    space = _xspace_class()()
    space.hostnames.append("single-run")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", base_ns)
    worker = host.line(101, "tf_Compute/1", base_ns)
    t = base_ns + 3 * NS_PER_MS
    for line, name, start, end in (
        (python, "ImportModules", 0, 5),
        (python, "IteratorGetNext", 5, 15),
        (python, "EagerExecute", 15, 55),
        (worker, "ExecutorState::Process", 16, 54),
        (python, "SaveCheckpoint", 60, 80),
    ):
        host.event(line, name, t + start * NS_PER_MS, t + end * NS_PER_MS)
    host.finish()
    return _write_space(space, path)


UNREPEATED_TRACE_MS = 80.0
UNREPEATED_INPUT_MS = 10.0


def write_two_function_trace(
    path: str | Path,
    *,
    train_calls: int = 5,
    eval_calls: int = 8,
    base_ns: int = ABSOLUTE_BASE_NS,
) -> Path:
    """A TensorFlow-style CPU trace with two `tf.function`s called from the Python thread, no markers.

    As TensorFlow writes them: per call, `IteratorGetNext` (1 ms), then the call event
    named after the function (`train_step`, `eval_step`, with the `tf_function_call`
    stat `notTraced-nonXla`) holding `EagerLocalExecute: __inference_train_step_842`
    (or `__inference_eval_step_901`) and `FunctionRun`, with `ExecutorState::Process` on
    a `tf_Compute` thread. `train_calls` train steps of 10 ms (call 6 ms) come first,
    then `eval_calls` eval steps of 5 ms (call 3 ms): evaluation is called more often.
    """
    space = _xspace_class()()
    space.hostnames.append("two-functions")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", base_ns)
    worker = host.line(101, "tf_Compute/2", base_ns)
    t = base_ns + 2 * NS_PER_MS
    for name, inference, calls, period, call in (
        ("train_step", "__inference_train_step_842", train_calls, 10, 6),
        ("eval_step", "__inference_eval_step_901", eval_calls, 5, 3),
    ):
        for _ in range(calls):
            at = t + NS_PER_MS
            end = at + call * NS_PER_MS
            host.event(python, "IteratorGetNext", t, at)
            host.event(python, name, at, end, tf_function_call="notTraced-nonXla")
            host.event(python, f"EagerLocalExecute: {inference}", at + 50_000, end - 50_000)
            host.event(python, "FunctionRun", at + 100_000, end - 100_000)
            host.event(worker, "ExecutorState::Process", at + 200_000, end - 200_000)
            t += period * NS_PER_MS
    host.finish()
    return _write_space(space, path)
