"""Synthetic traces of the ways real traces differ from the ones devprof makes itself.

Each builder writes an XSpace with exactly known durations that reproduces one situation
seen in real GPU/TPU traces: a GPU tracer that recorded nothing, a device running behind
the host, a capture whose only step is the device's `Steps` line, input copies on a copy
stream beside the kernels, several programs where one is the step, a JAX loop. Times are
integer nanoseconds at an absolute, epoch-like base.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trace_fixtures import ABSOLUTE_BASE_NS, _ns, _Plane, _write_space, _xspace_class

MS = 1_000_000


@dataclass(frozen=True)
class TfGpuTrace:
    path: Path
    steps: int
    host_step_ms: float
    device_step_ms: float  # each device step's own span: first kernel start to last kernel end
    device_compute_ms: float
    input_wait_ms: float  # the host blocked in IteratorGetNext per step
    overlapped_copy_ms: float  # host-to-device copies under the kernels, per step


def write_tf_gpu_loop(
    path: str | Path,
    *,
    steps: int = 6,
    host_step_ms: float = 5.0,
    input_wait_ms: float = 0.2,
    kernels_ms: tuple[float, ...] = (4.0, 3.0),
    kernel_gap_ms: float = 1.0,
    device_period_ms: float = 8.0,
    device_lag_ms: float = 3.0,
    overlapped_copy_ms: float = 0.0,
    record_gpu: bool = True,
    gpu_stops_after: int | None = None,
    compile_ms: float = 0.0,
    base_ns: int = ABSOLUTE_BASE_NS,
) -> TfGpuTrace:
    """A custom TensorFlow loop (`Trace("train", step_num=k, _r=1)` markers) on one CUDA GPU.

    Host step k: [T + k * host_step, +host_step), `IteratorGetNext` for its first
    `input_wait_ms`, then one `cuLaunchKernel` per kernel (correlation ids). The GPU runs
    step k's kernels from `T + device_lag + k * device_period`, one after another with
    `kernel_gap_ms` between them: with a device period longer than the host step the
    device falls behind, and step k's kernels run during later host steps. With
    `overlapped_copy_ms`, a `MemcpyH2D` on a copy stream runs under the first kernel
    (the next batch, prefetched). Without `record_gpu` the GPU plane is there but empty,
    as when CUPTI could not start; with `gpu_stops_after` k it holds only the kernels of the
    first k steps while the host goes on launching (the tracer dropped the rest). With
    `compile_ms`, the first step spends that long in `tf.function-graph_building` (on a thread of its own).
    """
    space = _xspace_class()()
    space.hostnames.append("tf-gpu-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(1, "python", base_ns)
    gpu = _Plane(space, 1, "/device:GPU:0")
    compute = gpu.line(7, "Stream #7(Compute)", base_ns) if record_gpu else None
    copies = gpu.line(8, "Stream #8(MemcpyH2D)", base_ns) if record_gpu else None
    start = base_ns + 2 * MS
    correlation = 100
    span = sum(_ns(k) for k in kernels_ms) + _ns(kernel_gap_ms) * (len(kernels_ms) - 1)
    for k in range(steps):
        t = start + k * _ns(host_step_ms)
        host.event(python, "train", t, t + _ns(host_step_ms) - 50_000, step_num=k, _r=1)
        host.event(python, "IteratorGetNext", t, t + _ns(input_wait_ms))
        if compile_ms and k == 0:
            builder = host.line(2, "tf_graph_building", base_ns)
            host.event(
                builder, "tf.function-graph_building", t + _ns(input_wait_ms), t + _ns(input_wait_ms + compile_ms)
            )
        at = t + _ns(input_wait_ms) + 10_000
        device_at = start + _ns(device_lag_ms) + k * _ns(device_period_ms)
        for j, length in enumerate(kernels_ms):
            host.event(python, "cuLaunchKernel", at, at + 20_000, correlation_id=correlation)
            at += 30_000
            if compute is not None and (gpu_stops_after is None or k < gpu_stops_after):
                gpu.event(compute, f"volta_sgemm_{j}", device_at, device_at + _ns(length), correlation_id=correlation)
                if j == 0 and overlapped_copy_ms:
                    copy_at = device_at + (_ns(length) - _ns(overlapped_copy_ms)) // 2
                    gpu.event(
                        copies,
                        "MemcpyH2D",
                        copy_at,
                        copy_at + _ns(overlapped_copy_ms),
                        correlation_id=correlation + 50_000,
                    )
                    host.event(python, "cuMemcpyHtoDAsync_v2", at, at + 20_000, correlation_id=correlation + 50_000)
                    at += 30_000
            device_at += _ns(length) + _ns(kernel_gap_ms)
            correlation += 1
    host.finish()
    gpu.finish()
    return TfGpuTrace(
        _write_space(space, path), steps, host_step_ms, span / MS, sum(kernels_ms), input_wait_ms, overlapped_copy_ms
    )


def write_grouped_with_callbacks(path: str | Path, *, steps: int = 4, base_ns: int = ABSOLUTE_BASE_NS) -> Path:
    """Host `group_id` groups only: `steps` training steps, each followed by a callback's group."""
    space = _xspace_class()()
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(1, "python", base_ns)
    t = base_ns + MS
    for k in range(steps):
        host.event(python, "__inference_train_function_812", t, t + 8 * MS, group_id=2 * k + 1)
        host.event(python, "IteratorGetNext", t, t + MS, group_id=2 * k + 1)
        host.event(python, "__inference_on_train_batch_end_9", t + 8 * MS, t + 9 * MS, group_id=2 * k + 2)
        t += 10 * MS
    host.event(python, "SaveCheckpoint", t + MS, t + 2 * MS)  # the window goes on after the last step
    host.finish()
    return _write_space(space, path)


def write_one_step_capture(path: str | Path, *, step_ms: float = 63.0, base_ns: int = ABSOLUTE_BASE_NS) -> Path:
    """A Keras capture of one step: the device's `Steps` line has one event of `step_ms`;
    the host's `group_id` stats form two groups (the step's, and a callback's short one after it)."""
    space = _xspace_class()()
    space.hostnames.append("keras-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(1, "python", base_ns)
    executor = host.line(2, "tf_executor", base_ns)
    gpu = _Plane(space, 1, "/device:GPU:0")
    stream = gpu.line(7, "Stream #7(Compute)", base_ns)
    steps_line = gpu.line(0xDEADBEEF, "Steps", base_ns)
    t = base_ns + MS
    host.event(python, "__inference_train_function_812", t, t + _ns(74.6), group_id=1)
    host.event(executor, "ExecutorState::Process", t + MS, t + _ns(70.0), group_id=1)
    host.event(python, "__inference_on_train_batch_end_9", t + _ns(75.0), t + _ns(76.5), group_id=2)
    device_at = t + _ns(4.0)
    gpu.event(steps_line, "1", device_at, device_at + _ns(step_ms), group_id=1)
    gpu.event(stream, "volta_sgemm", device_at, device_at + _ns(step_ms / 2), group_id=1, correlation_id=1)
    gpu.event(
        stream,
        "volta_scudnn",
        device_at + _ns(step_ms / 2) + MS,
        device_at + _ns(step_ms),
        group_id=1,
        correlation_id=2,
    )
    host.finish()
    gpu.finish()
    return _write_space(space, path)


EXECUTE = "PjRtStreamExecutorLoadedExecutable::Execute"


def write_jax_programs(
    path: str | Path,
    programs: list[str],
    *,
    execute_ms: float = 1.0,
    gap_ms: float = 4.0,
    kernel_ms: dict[str, float] | None = None,
    base_ns: int = ABSOLUTE_BASE_NS,
) -> Path:
    """A JAX loop on one GPU: one PjRt execution per entry of `programs` (its module name, as
    XLA's `GpuExecutable::ExecuteThunks` stat `module_name` says), `gap_ms` of Python between
    executions, and one kernel per execution from 0.2 ms into it: to the execution's end, or
    `kernel_ms[module]` long (which may run past it)."""
    space = _xspace_class()()
    space.hostnames.append("jax-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(1, "python", base_ns)
    gpu = _Plane(space, 1, "/device:GPU:0")
    stream = gpu.line(16, "Stream #16(Kernel)", base_ns)
    t = base_ns + MS
    for i, module in enumerate(programs):
        host.event(python, EXECUTE, t, t + _ns(execute_ms))
        host.event(python, "GpuExecutable::ExecuteThunks", t + 50_000, t + _ns(execute_ms) - 50_000, module_name=module)
        host.event(python, "hipModuleLaunchKernel", t + 100_000, t + 120_000, correlation_id=10 + i)
        kernel_end = t + 200_000 + _ns(kernel_ms[module]) if kernel_ms and module in kernel_ms else t + _ns(execute_ms)
        gpu.event(stream, f"{module}_fusion", t + 200_000, kernel_end, correlation_id=10 + i, hlo_module=module)
        t += _ns(execute_ms + gap_ms)
    host.finish()
    gpu.finish()
    return _write_space(space, path)


def write_jax_tpu_async(
    path: str | Path,
    *,
    steps: int = 6,
    host_period_ms: float = 5.0,
    device_program_ms: float = 8.0,
    op_ms: float = 6.0,
    cores: int = 2,
    base_ns: int = ABSOLUTE_BASE_NS,
) -> Path:
    """JAX on TPU cores with asynchronous dispatch: the host's k-th `Execute` returns at once, every
    `host_period_ms`; each core runs its k-th `jit_train_step(7)` module for `device_program_ms`
    back to back (so it falls further behind), with one `fusion` op of `op_ms` in it."""
    space = _xspace_class()()
    space.hostnames.append("tpu-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(1, "python", base_ns)
    t = base_ns + MS
    for k in range(steps):
        at = t + k * _ns(host_period_ms)
        host.event(python, EXECUTE, at, at + _ns(0.3))
    for core in range(cores):
        tpu = _Plane(space, 1 + core, f"/device:TPU:{core}")
        modules = tpu.line(2, "XLA Modules", base_ns)
        ops = tpu.line(3, "XLA Ops", base_ns)
        for k in range(steps):
            start = t + _ns(0.5) + k * _ns(device_program_ms)
            tpu.event(modules, "jit_train_step(7)", start, start + _ns(device_program_ms))
            tpu.event(ops, "fusion.3", start + _ns(1.0), start + _ns(1.0 + op_ms))
        tpu.finish()
    host.finish()
    return _write_space(space, path)


def write_groups_finer_than_markers(
    path: str | Path,
    *,
    steps: int = 5,
    groups_per_step: int = 2,
    kernel_ms: float = 15.0,
    group_span_ms: float = 20.0,
    gpus: int = 2,
    base_ns: int = ABSOLUTE_BASE_NS,
) -> Path:
    """TensorFlow on several GPUs whose markers each hold `groups_per_step` XProf groups: every
    host marker is `groups_per_step * group_span_ms` long, and each group's kernels (with its
    `group_id`) run `kernel_ms` within its own `group_span_ms` on every GPU."""
    space = _xspace_class()()
    space.hostnames.append("mirrored-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(1, "python", base_ns)
    planes = [_Plane(space, 1 + g, f"/device:GPU:{g}") for g in range(gpus)]
    streams = [plane.line(7, "Stream #7(Compute)", base_ns) for plane in planes]
    t = base_ns + MS
    span = _ns(group_span_ms)
    for k in range(steps):
        start = t + k * groups_per_step * span
        host.event(
            python,
            "train",
            start,
            start + groups_per_step * span - 10_000,
            step_num=k,
            _r=1,
            group_id=k * groups_per_step,
        )
        for j in range(groups_per_step):
            group = k * groups_per_step + j
            at = start + j * span
            host.event(python, "__inference_replica_step", at + 10_000, at + 500_000, group_id=group)
            for plane, stream in zip(planes, streams):
                plane.event(stream, "volta_sgemm", at + MS, at + MS + _ns(kernel_ms / 2), group_id=group)
                plane.event(stream, "volta_scudnn", at + span - _ns(kernel_ms / 2), at + span, group_id=group)
    host.finish()
    for plane in planes:
        plane.finish()
    return _write_space(space, path)


@dataclass(frozen=True)
class KerasCpuTrace:
    path: Path
    step_ms: float  # Keras' step: the executed function's span (its group's root)
    input_ms: float
    compute_ms: float  # executor spans of the step's function, less its input
    call_ms: float  # the Python-level train_function call, dispatch included
    window_ms: float  # the whole traced window


def write_keras_cpu_capture(
    path: str | Path,
    *,
    steps: int = 1,
    groups: bool = True,
    evaluation: bool = False,
    root_marker: bool = True,
    summary_ms: float = 0.03,
    base_ns: int = ABSOLUTE_BASE_NS,
) -> KerasCpuTrace:
    """A Keras 2 `fit` on a CPU, as TensorFlow 2.4 wrote it for the TensorBoard callback: no step
    marker; per step a `train_function` call (`tf_function_call` stat) whose first 0.7 ms is
    Python-level dispatch, then `EagerKernelExecute` of the function for 6.4 ms (the group's root,
    `group_id` k), holding `FunctionRun` (`_r=1`, `_p`); on an executor thread two
    `ExecutorState::Process` spans linked by `_c` (6.0 ms, of which a 0.1 ms `IteratorGetNext`),
    and after the call the eager summary ops TensorFlow puts in the same group. The window goes on
    with a summary flush. Without `groups`, no `group_id` or `_r` stats (a newer TensorFlow writes
    none). With `evaluation`, a `test_function` call with its own group follows the last step. Without
    `root_marker`, the groups have no `_r` root (their events alone say where they run); `summary_ms` is
    the TensorBoard callback's `WriteSummary` after each call, in the step's group."""
    space = _xspace_class()()
    space.hostnames.append("keras-cpu")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(0, "python", base_ns)
    executor = host.line(1, "tf_Compute/1", base_ns)
    dispatch, root, tail, period = _ns(0.7), _ns(6.4), _ns(0.2), _ns(10.0)
    t0 = base_ns + MS
    for k in range(steps + (1 if evaluation else 0)):
        t = t0 + k * period
        is_eval = k == steps
        group = {"group_id": 100 + k if is_eval else k} if groups else {}
        name = "test_function" if is_eval else "train_function"
        host.event(python, name, t, t + dispatch + root + tail, tf_function_call="notTraced-nonXla")
        at = t + dispatch
        host.event(python, "EagerKernelExecute", at, at + root, **group)
        producer = 7_000 + k
        host.event(
            python,
            "FunctionRun",
            at + _ns(0.01),
            at + _ns(0.08),
            _p=producer,
            **({"_r": 1} if groups and root_marker else {}),
            **group,
        )
        host.event(executor, "ExecutorState::Process", at + _ns(0.1), at + _ns(3.1), _c=producer, **group)
        host.event(executor, "IteratorGetNext:IteratorGetNext", at + _ns(0.1), at + _ns(0.2), **group)
        host.event(executor, "dense/MatMul:_MklMatMul", at + _ns(0.3), at + _ns(3.0), **group)
        host.event(executor, "ExecutorState::Process", at + _ns(3.2), at + _ns(6.2), _c=producer, **group)
        host.event(executor, "dense/MatMul_1:_MklMatMul", at + _ns(3.3), at + _ns(6.1), **group)
        after = t + dispatch + root + tail + _ns(0.3)
        host.event(python, "EagerKernelExecute", after, after + _ns(summary_ms + 0.02), **group)
        host.event(python, "WriteSummary:WriteSummary", after + _ns(0.01), after + _ns(0.01 + summary_ms), **group)
    end = t0 + (steps - 1) * period + dispatch + root + tail + _ns(0.9 + max(0.0, summary_ms - 0.03))
    host.event(python, "FlushSummaryWriter:FlushSummaryWriter", end - _ns(0.4), end)
    host.finish()
    return KerasCpuTrace(_write_space(space, path), 6.4, 0.1, 5.9, 7.3, (end - t0) / MS)


TFRT_TPU_EXECUTE = "TfrtTpuLoadedExecutable::Execute"


@dataclass(frozen=True)
class TpuProgramsTrace:
    path: Path
    cores: int
    executions: int  # executions of the main program on each core, the one cut by the window included
    program_ms: float  # one execution of the main program on a core
    busy_ms: float  # its XLA Ops time per execution


def write_tpu_programs(
    path: str | Path,
    *,
    cores: int = 4,
    executions: int = 6,
    program_ms: float = 7.84,
    op_ms: float = 7.0,
    helpers: tuple[str, ...] = ("jit_convert", "jit_copy"),
    cut_first: bool = True,
    launch_lead_ms: float = 0.5,
    period_ms: float | None = None,
    device_programs: bool = True,
    base_ns: int = ABSOLUTE_BASE_NS,
) -> TpuProgramsTrace:
    """JAX on a TPU through TFRT: one host thread per core launches `TfrtTpuLoadedExecutable::Execute`
    (the launch carries only its `program_id` stat) for `jit_f` (id 5), each followed by one quick
    launch of every program of `helpers` (ids 6, 7, ...). Each core's `XLA Modules` line runs
    `jit_f(5)` for `program_ms` back to back (an `XLA Ops` fusion of `op_ms` in each), with each
    helper's 0.05 ms module in between. With `cut_first`, the profiler started during the first
    execution: its module is clipped to the window's first nanosecond and has no launch in the trace.
    Each launch is recorded `launch_lead_ms` before its execution starts on the device (negative: after
    it, as where the host's and the TPU's clocks differ); `period_ms` spaces the executions. Without
    `device_programs` the cores have no `XLA Modules` line (only their ops)."""
    space = _xspace_class()()
    space.hostnames.append("tpu-vm")
    host = _Plane(space, 0, "/host:CPU")
    threads = [host.line(10 + c, f"tpu_launch/{c}", base_ns) for c in range(cores)]
    gap = _ns(0.05)
    period = _ns(period_ms) if period_ms else _ns(program_ms) + len(helpers) * (gap + _ns(0.05)) + gap
    t0 = base_ns + MS
    for core in range(cores):
        tpu = _Plane(space, 1 + core, f"/device:TPU:{core}")
        modules = tpu.line(2, "XLA Modules" if device_programs else "XLA TraceMe", base_ns)
        ops = tpu.line(3, "XLA Ops", base_ns)
        early = _ns(program_ms / 2) if cut_first else 0  # how much of the first execution ran before the window
        for k in range(executions):
            start = t0 + k * period - early
            launched = not (cut_first and k == 0)
            tpu.event(modules, "jit_f(5)", max(start, t0), start + _ns(program_ms), program_id=5)
            tpu.event(ops, "fusion.1", max(start + _ns(program_ms) - _ns(op_ms), t0), start + _ns(program_ms))
            at = start + _ns(program_ms) + gap
            for h, helper in enumerate(helpers):
                tpu.event(modules, f"{helper}({6 + h})", at, at + _ns(0.05), program_id=6 + h)
                tpu.event(ops, "copy.1", at, at + _ns(0.05))
                at += _ns(0.05) + gap
            if launched:
                launch = start - _ns(launch_lead_ms)
                host.event(threads[core], TFRT_TPU_EXECUTE, launch, launch + _ns(0.02), program_id=5)
                for h in range(len(helpers)):
                    host.event(
                        threads[core],
                        TFRT_TPU_EXECUTE,
                        launch + _ns(0.03 * (h + 1)),
                        launch + _ns(0.03 * (h + 1) + 0.02),
                        program_id=6 + h,
                    )
        tpu.finish()
    host.finish()
    return TpuProgramsTrace(_write_space(space, path), cores, executions, program_ms, op_ms)
