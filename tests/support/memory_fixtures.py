"""A trace with allocator events whose memory figures are worked out by hand (no TensorFlow run).

`write_memory_trace` writes what TensorFlow's BFC allocators write on the host plane (one
`MemoryAllocation` / `MemoryDeallocation` event per allocation, each with `allocator_name`,
`bytes_allocated`, `bytes_available`, ...) for a few steps of a small conv step, with step markers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trace_fixtures import ABSOLUTE_BASE_NS, _Plane, _write_space, _xspace_class

MS = 1_000_000
MiB = 2**20
GPU = "GPU_0_bfc"
PINNED = "gpu_host_bfc"
PINNED_CAPACITY = 64 * 2**30


@dataclass
class MemoryTrace:
    """The trace written, and what the analysis must find in it."""

    path: Path
    batch: int
    peak_bytes: int  # GPU_0_bfc's peak in the window
    peak_step: int
    peak_time_ms: float  # from the window's first event
    peak_op: str
    before_bytes: int  # in use before the window
    live_at_peak: dict  # op -> bytes, the allocations of the window live at the peak
    capacity_bytes: int
    fragmentation: float
    batch_bytes: int  # live at the peak with the batch as first dimension
    fixed_bytes: int
    max_batch: int
    end_bytes: list = field(default_factory=list)  # per step, in use at its end
    pinned_peak_bytes: int = 0  # gpu_host_bfc's peak


class _Allocator:
    """Writes one allocator's events with its running bytes in use, as a BFC allocator states them."""

    def __init__(
        self, plane: _Plane, line, name: str, before: int, capacity: int, fragmentation: float, lifetime_peak: int
    ):
        self.plane, self.line, self.name = plane, line, name
        self.in_use, self.capacity, self.fragmentation = before, capacity, fragmentation
        self.lifetime_peak = lifetime_peak
        self.live: dict[int, tuple[int, int]] = {}  # address -> (requested, allocated)
        self.peak = before

    def _event(self, name: str, at: int, address: int, requested: int, allocated: int, **more) -> None:
        self.lifetime_peak = max(self.lifetime_peak, self.in_use)
        self.plane.event(
            self.line,
            name,
            at,
            at,
            allocator_name=self.name,
            bytes_reserved=0,
            bytes_allocated=self.in_use,
            bytes_available=self.capacity - self.in_use,
            fragmentation=float(self.fragmentation),
            peak_bytes_in_use=self.lifetime_peak,
            requested_bytes=requested,
            allocation_bytes=allocated,
            addr=address,
            **more,
        )

    def allocate(
        self,
        at: int,
        address: int,
        op: str,
        shape: str,
        dtype: int,
        requested: int,
        allocated: int,
        region: str,
        step: int,
    ) -> None:
        self.in_use += allocated
        self.peak = max(self.peak, self.in_use)
        self.live[address] = (requested, allocated)
        self._event(
            "MemoryAllocation",
            at,
            address,
            requested,
            allocated,
            tf_op=op,
            region_type=region,
            data_type=dtype,
            shape=shape,
            group_id=step,
            id=address,
        )

    def free(self, at: int, address: int, step: int) -> None:
        requested, allocated = self.live.pop(address)
        self.in_use -= allocated
        self._event("MemoryDeallocation", at, address, requested, allocated, data_type=0, group_id=step, id=0)


FLOAT, UINT8, INT32 = 1, 4, 3


def write_memory_trace(
    path: str | Path,
    *,
    steps: int = 3,
    batch: int = 8,
    capacity: int = 16 * MiB,
    fragmentation: float = 0.25,
    extra_step: int | str | None = 1,
    extra_bytes: int = 3 * MiB,
    leak_bytes: int = 0,
    base_ns: int = ABSOLUTE_BASE_NS,
    allocator: str = GPU,
    extra_op: str = "extra/Fill",
    extra_shape: str | None = None,
    extra_dtype: int = 1,
    extra_region: str = "output",
    lifetime_peak: int = 13 * MiB,
) -> MemoryTrace:
    """`steps` steps of 10 ms (step markers `train`, step_num k) from base + 10 ms; the window starts at
    base + 1 ms (a `ProfilerSession::Start` event).

    GPU_0_bfc holds 4 MiB from before the window (weights). Step k, from its start T (ms):
    +1 `model/conv/Conv2D` output [batch,64,32,32] float; +2 its 1 MiB temp [1048576] uint8, freed at
    +3; +4 `model/dense/MatMul` [batch,10] float (320 bytes asked, 512 allocated); +5
    `gradient_tape/conv/Conv2DBackpropInput` [batch,64,32,32]: the step's peak; +6, +6.1, +6.2 the
    three freed. In `extra_step` an `extra/Fill` of `extra_bytes` ([n] float) is made at +0.5 and freed
    at +6.5: held across the step's peak (in every step with `extra_step="every"`). With `leak_bytes`, a `loss/Identity` scalar of that many
    bytes is made at +7 each step and never freed. Every event states `fragmentation`, bytes
    available = `capacity` - bytes in use, and a lifetime peak above the window's (13 MiB at least,
    which the window's peak is not read from). gpu_host_bfc: 1 KiB from before, one 256-byte
    `SameWorkerRecvDone` per step from +0.2 to +8. `allocator` names the main allocator; `extra_op`,
    `extra_shape` (else [n] float), `extra_dtype` and `extra_region` say what the extra tensor is;
    `lifetime_peak` is the main allocator's own peak before the window.
    """
    assert batch * 64 * 32 * 32 * 4 == 2 * MiB * batch // 8
    space = _xspace_class()()
    space.hostnames.append("memory-host")
    host = _Plane(space, 0, "/host:CPU")
    python = host.line(100, "python", base_ns)
    worker = host.line(101, "tf_Compute/7", base_ns)
    gpu = _Allocator(host, worker, allocator, 4 * MiB, capacity, fragmentation, lifetime_peak)
    pinned = _Allocator(host, python, PINNED, 1024, PINNED_CAPACITY, 0.0, 1024)
    host.event(python, "ProfilerSession::Start", base_ns + MS, base_ns + 2 * MS)
    activation = batch * 64 * 32 * 32 * 4
    shape = f"[{batch},64,32,32]"
    peak, peak_step, peak_time, ends = 0, -1, 0.0, []
    live_at_peak: dict = {}
    for k in range(steps):
        t = base_ns + 10 * MS + k * 10 * MS
        at = lambda ms: t + int(round(ms * MS))  # noqa: E731 - the step's own clock
        host.event(python, "train", t, t + 10 * MS - 100_000, step_num=k, _r=1)
        pinned.allocate(at(0.2), 9000 + k, "SameWorkerRecvDone", "[]", INT32, 4, 256, "dynamic", k)
        extra = extra_step == k or extra_step == "every"
        if extra:
            gpu.allocate(
                at(0.5),
                5000,
                extra_op,
                extra_shape or f"[{extra_bytes // 4}]",
                extra_dtype,
                extra_bytes,
                extra_bytes,
                extra_region,
                k,
            )
        gpu.allocate(at(1), 1000, "model/conv/Conv2D", shape, FLOAT, activation, activation, "output", k)
        gpu.allocate(at(2), 2000, "model/conv/Conv2D", "[1048576]", UINT8, MiB, MiB, "temp", k)
        gpu.free(at(3), 2000, k)
        gpu.allocate(at(4), 3000, "model/dense/MatMul", f"[{batch},10]", FLOAT, batch * 40, 512, "output", k)
        gpu.allocate(
            at(5), 4000, "gradient_tape/conv/Conv2DBackpropInput", shape, FLOAT, activation, activation, "output", k
        )
        if gpu.in_use > peak:
            peak, peak_step, peak_time = gpu.in_use, k, (t + 5 * MS - base_ns - MS) / MS
            live_at_peak = {
                "model/conv/Conv2D": activation,
                "model/dense/MatMul": 512,
                "gradient_tape/conv/Conv2DBackpropInput": activation,
            }
            if extra:
                live_at_peak[extra_op] = extra_bytes
            leaked = leak_bytes * k
            if leaked:
                live_at_peak["loss/Identity"] = leaked
        gpu.free(at(6), 1000, k)
        gpu.free(at(6.1), 3000, k)
        gpu.free(at(6.2), 4000, k)
        if extra:
            gpu.free(at(6.5), 5000, k)
        if leak_bytes:
            gpu.allocate(at(7), 6000 + k, "loss/Identity", "[]", FLOAT, leak_bytes, leak_bytes, "output", k)
        pinned.free(at(8), 9000 + k, k)
        ends.append(gpu.in_use)
    host.finish()
    written = _write_space(space, path)
    scaled = 2 * activation + 512
    fixed = peak - scaled
    usable = peak + (capacity - peak) * (1 - fragmentation)
    return MemoryTrace(
        written,
        batch,
        peak,
        peak_step,
        peak_time,
        "gradient_tape/conv/Conv2DBackpropInput",
        4 * MiB,
        live_at_peak,
        capacity,
        fragmentation,
        scaled,
        fixed,
        int(batch * (usable - fixed) // scaled),
        ends,
        pinned.peak,
    )


@dataclass
class PjrtMemoryTrace:
    """A trace of PJRT's allocator events (JAX on TPUs), and each device's figures worked out by hand."""

    path: Path
    peak_bytes: dict  # "TPU_<i>" -> heap + reserved at its peak
    reserved_at_peak: dict  # "TPU_<i>" -> the reserved (stack) bytes of that peak
    capacity_bytes: int
    lifetime_peak_bytes: dict  # "TPU_<i>" -> the largest `peak_bytes_in_use` its events state


def write_pjrt_memory_trace(
    path: str | Path, *, devices: int = 2, capacity: int = 1024 * MiB, base_ns: int = ABSOLUTE_BASE_NS
) -> PjrtMemoryTrace:
    """What PJRT's TPU allocator writes: `MemoryAllocation`/`MemoryDeallocation` on the host plane naming
    the device by `index_on_host`, no `allocator_name`; `bytes_reserved` (the program's stack) moves
    between events without an allocation of its own. Device i: a 100 MiB + i MiB argument from 1 ms, then
    a program whose stack reserves 300 MiB from 3 ms (stated by the next event, a 1 MiB output at 3 ms),
    freed at 5 ms with the stack released; a 64 KiB buffer from before the window is freed at 6 ms.
    Each device has its own `/device:TPU:i` plane with one `XLA Ops` event."""
    space = _xspace_class()()
    space.hostnames.append("tpu-host")
    host = _Plane(space, 0, "/host:CPU")
    main = host.line(100, "main", base_ns)
    peaks, reserved_at_peak, lifetime = {}, {}, {}
    for i in range(devices):
        tpu = _Plane(space, 10 + i, f"/device:TPU:{i}")
        ops = tpu.line(1, "XLA Ops", base_ns)
        tpu.event(ops, "fusion.1", base_ns + 3 * MS, base_ns + 5 * MS)
        tpu.finish()
        before, argument, output, stack = 64 * 1024, (100 + i) * MiB, MiB, 300 * MiB
        state = {"heap": before, "reserved": 0, "peak": before + 200 * MiB}  # lifetime peak: before the window

        def event(name, at_ms, address, size, op="", shape="", i=i, state=state):
            state["peak"] = max(state["peak"], state["heap"])
            stats = dict(
                index_on_host=i,
                bytes_allocated=state["heap"],
                bytes_reserved=state["reserved"],
                bytes_available=capacity - state["heap"] - state["reserved"],
                peak_bytes_in_use=state["peak"],
                fragmentation=0.0,
                addr=address,
            )
            if name == "MemoryAllocation":
                stats.update(requested_bytes=size, allocation_bytes=size, tf_op=op, shape=shape, data_type=1, id=0)
            at = base_ns + int(at_ms * MS) + i * 1000
            host.event(main, name, at, at, **stats)

        state["heap"] += argument
        event("MemoryAllocation", 1, 0x1000, argument, "dummy", f"f32[{argument // 4}]")
        state["heap"] += output
        state["reserved"] = stack
        event("MemoryAllocation", 3, 0x2000, output)
        peaks[f"TPU_{i}"], reserved_at_peak[f"TPU_{i}"] = state["heap"] + state["reserved"], stack
        state["heap"] -= argument
        state["reserved"] = 0
        event("MemoryDeallocation", 5, 0x1000, argument)
        state["heap"] -= before
        event("MemoryDeallocation", 6, 0x3000, before)
        lifetime[f"TPU_{i}"] = state["peak"]
    host.finish()
    return PjrtMemoryTrace(_write_space(space, path), peaks, reserved_at_peak, capacity, lifetime)
