"""Device resolution: `--device auto|cpu|gpu|tpu` to a tf.distribute strategy, and device facts.

TensorFlow is reached through `TFBackend`, so tests drive the GPU and TPU branches with a
fake backend on a machine that has neither.
"""

from __future__ import annotations

import os
import platform
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from profiler.samplers.base import is_nan

DEVICE_KINDS = ("auto", "cpu", "gpu", "tpu")
TPU_ENV_VARS = ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_WORKER_HOSTNAMES")
TPU_DEVICE_FILES = ("/dev/accel0", "/dev/vfio/0")  # a TPU VM's chips (older generations, v5e and later)
# Connecting to a TPU that is not there does not fail: TensorFlow waits for it forever.
TPU_TIMEOUT_ENV = "DEVPROF_TPU_TIMEOUT_S"
DEFAULT_TPU_TIMEOUT_S = 30.0
# A worker of a multi-worker job waits this long for every other worker to start (all hosts of a
# cluster rarely start at the same second), then gives up instead of waiting forever.
CLUSTER_WAIT_ENV = "DEVPROF_CLUSTER_WAIT_S"
DEFAULT_CLUSTER_WAIT_S = 300.0
# MultiWorkerMirroredStrategy's peer health check: every HEALTH_INTERVAL_S each worker asks every
# other one whether it is alive (each question waits up to HEALTH_TIMEOUT_S, HEALTH_RETRIES tries);
# a peer that does not answer aborts the collectives, so the survivors fail instead of waiting.
# TensorFlow's default interval is 30 s; a dead peer's closed connection usually fails the running
# collective within a second anyway.
HEALTH_INTERVAL_S = 10
HEALTH_TIMEOUT_S = 10
HEALTH_RETRIES = 3


class DeviceError(Exception):
    """The requested device is not there (a usage error: exit code 2)."""


@dataclass
class Resolved:
    kind: str  # cpu | gpu | tpu
    strategy: object
    info: dict = field(default_factory=dict)


class TFBackend:
    """The few TensorFlow calls device resolution needs."""

    def __init__(self):
        from profiler.device import quiet

        self.tf = quiet.import_tensorflow()

    def physical_devices(self, kind: str) -> list:
        return self.tf.config.list_physical_devices(kind)

    def hide_gpus(self) -> None:
        try:
            self.tf.config.set_visible_devices([], "GPU")
        except RuntimeError:
            pass  # already initialized: GPUs stay visible, but the strategy still pins the CPU

    def set_inter_op_threads(self, threads: int) -> bool:
        """False where the runtime already started (the setting can no longer change)."""
        try:
            self.tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:
            return False
        return True

    def use_gpus(self, gpus) -> None:
        try:
            self.tf.config.set_visible_devices(gpus, "GPU")
        except RuntimeError:
            pass  # already initialized: every GPU stays visible

    def enable_memory_growth(self, gpus) -> None:
        for gpu in gpus:
            try:
                self.tf.config.experimental.set_memory_growth(gpu, True)
            except (RuntimeError, ValueError):
                pass  # runtime already initialized; growth cannot change now

    def gpu_details(self, gpu) -> dict:
        try:
            return dict(self.tf.config.experimental.get_device_details(gpu))
        except Exception:
            return {}

    def one_device_strategy(self, device: str):
        return self.tf.distribute.OneDeviceStrategy(device)

    def mirrored_strategy(self, devices: list[str]):
        return self.tf.distribute.MirroredStrategy(devices)

    def multi_worker_strategy(self, kind: str, timeout_s: float, wait_s: float, threads: tuple[int, int] | None):
        """MultiWorkerMirroredStrategy over the cluster in TF_CONFIG: collectives over gRPC (ring
        all-reduce on CPUs, NCCL on GPUs), each failing after `timeout_s`, and the peer health
        check tuned so that a dead worker stops the others within tens of seconds."""
        tf = self.tf
        if threads is not None:  # before the runtime starts: this worker's share of the machine's cores
            tf.config.threading.set_intra_op_parallelism_threads(threads[0])
            tf.config.threading.set_inter_op_parallelism_threads(threads[1])
        from tensorflow.python.distribute import collective_all_reduce_strategy as cars

        extended = cars.CollectiveAllReduceExtended
        health = {
            "_check_health_interval": HEALTH_INTERVAL_S,
            "_check_health_timeout": HEALTH_TIMEOUT_S,
            "_check_health_retry_limit": HEALTH_RETRIES,
            "_check_health_initial_timeout": wait_s,
        }
        for attribute, value in health.items():
            if hasattr(extended, attribute):  # private knobs: a TensorFlow without them keeps its defaults
                setattr(extended, attribute, value)
        implementation = tf.distribute.experimental.CommunicationImplementation
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=implementation.RING if kind == "cpu" else implementation.NCCL, timeout_seconds=timeout_s
        )
        # Collective instance keys fixed when a step function is traced (TensorFlow's default
        # gives every call new keys). With new keys a worker that is not the group leader resolves
        # each collective with a round trip to the leader, finished on a gRPC thread, and TensorFlow
        # 2.21's host tracer corrupts its heap merging such cross-thread events when the trace is
        # collected (the worker dies in tf.profiler.experimental.stop(), about one traced run in
        # four). Fixed keys are resolved once; the training loop traces its functions in the same
        # order on every worker, and gives every worker full batches, so the keys agree.
        from tensorflow.python.distribute import cross_device_utils

        launcher = cross_device_utils.CollectiveReplicaLauncher
        if hasattr(launcher, "_prefer_unique_instance_key"):
            launcher._prefer_unique_instance_key = False
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        return strategy, {
            "communication": "RING" if kind == "cpu" else "NCCL",
            "collective_timeout_s": timeout_s,
            "health_check": {
                "interval_s": HEALTH_INTERVAL_S,
                "timeout_s": HEALTH_TIMEOUT_S,
                "retries": HEALTH_RETRIES,
                "cluster_wait_s": wait_s,
            },
            "replicas": strategy.num_replicas_in_sync,
            "instance_keys": "per traced function",
        }

    def tpu_strategy(self, address: str | None):
        resolver = self.tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
        self.tf.config.experimental_connect_to_cluster(resolver)
        self.tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = self.tf.distribute.TPUStrategy(resolver)
        return strategy, {"tpu": address or resolver.master(), "cores": strategy.num_replicas_in_sync}


def tpu_hint_present(address: str | None) -> bool:
    """Only look for a TPU when something says there is one: probing a cluster resolver on an
    ordinary machine can wait on a metadata server that is not there."""
    if address:
        return True
    if any(os.environ.get(v) for v in TPU_ENV_VARS):
        return True
    return any(Path(name).exists() for name in TPU_DEVICE_FILES)


def resolve(
    device: str = "auto",
    gpus: int | None = None,
    tpu: str | None = None,
    backend: TFBackend | None = None,
    cluster=None,
    collective_timeout_s: float = 60.0,
) -> Resolved:
    if device not in DEVICE_KINDS:
        raise DeviceError(f"unknown device {device!r}; choose from {', '.join(DEVICE_KINDS)}")
    if gpus is not None and gpus < 1:
        raise DeviceError(f"--gpus must be at least 1 (got {gpus})")
    if cluster is not None:
        # TF_CONFIG before TensorFlow starts: the strategy reads it when it is created.
        os.environ["TF_CONFIG"] = cluster.tf_config
        return _resolve_multi_worker(backend or TFBackend(), device, gpus, cluster, collective_timeout_s)
    if device == "tpu" and not tpu_hint_present(tpu):
        # Nothing says a TPU is there: say so now, before TensorFlow starts and the resolver waits.
        raise DeviceError(
            f"no TPU reachable: this machine has no TPU device ({', '.join(TPU_DEVICE_FILES)}) and "
            f"none of {', '.join(TPU_ENV_VARS)} is set; give --tpu NAME_OR_ADDRESS for a TPU "
            "elsewhere, or use --device cpu or gpu"
        )
    backend = backend or TFBackend()
    if device == "tpu" or (device == "auto" and tpu_hint_present(tpu)):
        try:
            return _resolve_tpu(backend, tpu)
        except DeviceError:
            if device == "tpu":
                raise
    if device in ("gpu", "auto"):
        found = backend.physical_devices("GPU")
        if found:
            return _resolve_gpu(backend, found, gpus)
        if device == "gpu":
            raise DeviceError(f"no GPU found; TensorFlow sees only {_seen(backend)} ({_no_gpu_hint()})")
    if gpus is not None:
        raise DeviceError("--gpus needs --device gpu (or auto with GPUs present)")
    backend.hide_gpus()
    info = cpu_info()
    threads = cpu_inter_op_threads()
    if threads is not None and backend.set_inter_op_threads(threads):
        info["inter_op_threads"] = threads
    return Resolved("cpu", backend.one_device_strategy("/cpu:0"), info)


INTEROP_VAR = "TF_NUM_INTEROP_THREADS"


def cpu_inter_op_threads(environ=None, sockets: int | None = None) -> int | None:
    """How many ops a CPU run executes at once: one per CPU socket, each op on all of its cores
    (oneDNN's and Eigen's kernels split every op across the cores themselves). None where the user
    set `TF_NUM_INTEROP_THREADS` or asked for TensorFlow's defaults.

    TensorFlow's default runs as many ops at once as there are cores, so on a small machine two
    convolution gradients share the cores and each other's caches: the seed CNN's training step
    was 1.5-2 % slower so on a 2-core EPYC, in every one of 3 alternated pairs of runs."""
    environ = os.environ if environ is None else environ
    if environ.get(INTEROP_VAR) or environ.get(TENSORFLOW_DEFAULTS_VAR) == "1":
        return None
    return sockets or cpu_sockets()


def cpu_sockets() -> int:
    """Physical CPU packages (Linux sysfs); 1 where the topology cannot be read."""
    ids = set()
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/physical_package_id"):
        try:
            ids.add(path.read_text().strip())
        except OSError:
            continue
    return max(1, len(ids))


def _seconds_from_env(name: str, default: float) -> float:
    """A positive, finite number of seconds from environment variable `name`, else `default`."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value != float("inf")):
        raise DeviceError(f"{name} must be a finite number of seconds > 0 (got {text!r})")
    return value


def cluster_wait_s() -> float:
    """Seconds a worker waits for the others to start: DEVPROF_CLUSTER_WAIT_S, else 300."""
    return _seconds_from_env(CLUSTER_WAIT_ENV, DEFAULT_CLUSTER_WAIT_S)


def _resolve_multi_worker(backend, device: str, gpus: int | None, cluster, timeout_s: float) -> Resolved:
    """This process as worker `cluster.index` of a MultiWorkerMirroredStrategy job: its local CPU,
    or its first `--gpus` GPUs (all of them on each worker when not given)."""
    from profiler.device import cluster as cluster_mod

    if device == "tpu":
        raise DeviceError("several workers train with MultiWorkerMirroredStrategy on CPUs or GPUs, not TPUs")
    found = backend.physical_devices("GPU") if device in ("gpu", "auto") else []
    if device == "gpu" and not found:
        raise DeviceError(f"no GPU found on this worker; TensorFlow sees only {_seen(backend)} ({_no_gpu_hint()})")
    if gpus is not None and not found:
        raise DeviceError("--gpus needs --device gpu (or auto with GPUs present)")
    if gpus is not None and gpus > len(found):
        raise DeviceError(f"--gpus {gpus} requested but only {len(found)} GPU(s) found on this worker")
    local = cluster.local_workers()
    threads = cluster_mod.thread_counts(local)
    wait_s = cluster_wait_s()
    if found:
        backend.use_gpus(found[: gpus or len(found)])
        backend.enable_memory_growth(found[: gpus or len(found)])
        kind = "gpu"
    else:
        backend.hide_gpus()
        kind = "cpu"
    try:
        strategy, facts = backend.multi_worker_strategy(kind, timeout_s, wait_s, threads)
    except RuntimeError as exc:
        if "Timeout waiting for the cluster" in str(exc):
            raise DeviceError(
                f"not every worker of {', '.join(cluster.workers)} started within {wait_s:g} s "
                f"({CLUSTER_WAIT_ENV} sets the wait)"
            ) from None
        raise
    if kind == "cpu":
        info = cpu_info()
    else:
        details = [backend.gpu_details(d) for d in found[: gpus or len(found)]]
        info = {
            "name": details[0].get("device_name", "GPU") if details else "GPU",
            "gpus": [
                {"name": d.get("device_name"), "compute_capability": _cc(d.get("compute_capability"))} for d in details
            ],
        }
        info.update(_gpu_memory(len(details)))
    info.update(facts)
    info.update(
        strategy="MultiWorkerMirroredStrategy",
        count=facts["replicas"] // cluster.num_workers or 1,
        workers=cluster.num_workers,
        local_workers=local,
    )
    if threads is not None:
        info.update(intra_op_threads=threads[0], inter_op_threads=threads[1])
    return Resolved(kind, strategy, info)


def _no_gpu_hint(environ=None) -> str:
    """What to do when TensorFlow sees no GPU: CUDA_VISIBLE_DEVICES set to none ('' or -1), or to ids
    this machine does not have, hides them all, which the driver's own tools would not show."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        return (
            f"CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']!r} is set and hides every GPU it does not "
            "name: unset it or name the GPUs to use, or use --device cpu"
        )
    return "install the 'gpu' extra and an NVIDIA driver, or use --device cpu"


def _seen(backend) -> str:
    names = [d.name.replace("/physical_device:", "") for d in backend.physical_devices(None) or []]
    return ", ".join(names) or "no devices"


def _resolve_gpu(backend, found, gpus: int | None) -> Resolved:
    want = gpus or 1
    if want > len(found):
        raise DeviceError(
            f"--gpus {want} requested but only {len(found)} GPU(s) found: "
            + ", ".join(d.name.replace("/physical_device:", "") for d in found)
        )
    backend.enable_memory_growth(found)
    names = [f"/gpu:{i}" for i in range(want)]
    strategy = backend.one_device_strategy(names[0]) if want == 1 else backend.mirrored_strategy(names)
    details = [backend.gpu_details(d) for d in found[:want]]
    info = {
        "name": details[0].get("device_name", "GPU") if details else "GPU",
        "count": want,
        "gpus": [
            {"name": d.get("device_name"), "compute_capability": _cc(d.get("compute_capability"))} for d in details
        ],
        "strategy": type(strategy).__name__,
    }
    info.update(_gpu_memory(want))
    return Resolved("gpu", strategy, info)


def _cc(value):
    if isinstance(value, (tuple, list)):
        return ".".join(str(v) for v in value)
    return value


def _gpu_memory(count: int) -> dict:
    """Memory of the first `count` GPUs and the driver version, from NVML where it is there
    (device_details carries neither). NVML is read through the GPU sampler's guarded calls,
    so a missing driver or an unsupported query leaves the facts out instead of raising."""
    from profiler.samplers.gpu import discover_gpu_samplers

    found, _ = discover_gpu_samplers()  # one pass over every GPU
    try:
        totals = [gpu.total_memory_bytes() for gpu in found[:count]]
        driver = found[0].driver_version() if found else None
    finally:
        for gpu in found:
            gpu.close()
    facts: dict[str, object] = {}
    if totals and not any(is_nan(total) for total in totals):
        facts.update(memory_bytes=int(totals[0]), memory_bytes_per_gpu=[int(total) for total in totals])
    if driver:
        facts["driver"] = driver
    return facts


def tpu_timeout_s() -> float:
    """Seconds to wait for a TPU: DEVPROF_TPU_TIMEOUT_S, else 30."""
    return _seconds_from_env(TPU_TIMEOUT_ENV, DEFAULT_TPU_TIMEOUT_S)


class _NoAnswer(Exception):
    """The call did not return in time."""


def _call_with_timeout(function, timeout_s: float):
    """`function()` in a daemon thread; its result, its exception, or `_NoAnswer` after `timeout_s`.

    A thread left waiting on an unreachable TPU is abandoned: it is a daemon, so it does not
    keep the process alive, and nothing waits on it again.
    """
    outcome = {}

    def target():
        try:
            outcome["value"] = function()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="devprof-tpu-lookup", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise _NoAnswer(f"no answer within {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _resolve_tpu(backend, address: str | None) -> Resolved:
    from profiler.device import quiet

    timeout_s = tpu_timeout_s()
    try:
        # An unreachable TPU is also logged by TensorFlow and gRPC (`E0000 ...` lines); the one
        # `error:` line made from the exception says it (DEVPROF_DEBUG=1 shows them).
        with quiet.stderr_dropped_on_failure():
            strategy, facts = _call_with_timeout(lambda: backend.tpu_strategy(address), timeout_s)
    except _NoAnswer as exc:
        raise DeviceError(
            f"no TPU reachable{' at ' + address if address else ''} ({exc}; {TPU_TIMEOUT_ENV} sets the wait)"
        ) from None
    except Exception as exc:
        raise DeviceError(
            f"no TPU reachable{' at ' + address if address else ''} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'})"
        ) from None
    info = {"name": "TPU", "count": facts.get("cores"), "strategy": type(strategy).__name__, **facts}
    return Resolved("tpu", strategy, info)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# CPU features that run bfloat16 math in hardware: x86 AVX512-BF16 and AMX, Arm's BF16 extension.
BF16_X86_FLAGS = ("avx512_bf16", "amx_bf16")
BF16_ARM_FEATURE = "bf16"


def cpu_flags(cpuinfo: str | None = None) -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (x86 `flags`, Arm `Features`), or None where
    they cannot be read (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def bfloat16_units(flags: set[str] | None) -> list[str] | None:
    """The CPU features among `flags` that run bfloat16 in hardware ([] for none; None: unknown)."""
    if flags is None:
        return None
    return sorted(flag for flag in flags if flag in BF16_X86_FLAGS or flag == BF16_ARM_FEATURE)


def precision_warning(precision: str, kind: str, flags: set[str] | None) -> str | None:
    """Why `precision` will be slow on this device (a `warning:` line's text), or None."""
    if kind != "cpu":
        return None
    if precision == "mixed_float16":
        return (
            "float16 has no fast kernels on CPUs (it is emulated, often 10-100x slower); use --precision "
            "mixed_bfloat16 on a CPU with bfloat16 units, else float32"
        )
    if precision == "mixed_bfloat16" and flags is not None:
        if bfloat16_units(flags):
            return None
        arm = "asimd" in flags  # every 64-bit Arm CPU lists it; no x86 CPU does
        missing = f"the {BF16_ARM_FEATURE} feature" if arm else " or ".join(BF16_X86_FLAGS)
        return (
            f"this CPU has no bfloat16 units ({missing} not in its flags): bfloat16 math is emulated, often "
            "several times slower than float32; use --precision float32 on this CPU"
        )
    return None


ONEDNN_VAR = "TF_ENABLE_ONEDNN_OPTS"
_ONEDNN_BY_DEVPROF_VAR = "DEVPROF_SET_ONEDNN_OPTS"  # so that a run's workers know who set it


# `devprof run --tensorflow-defaults`, for this process and the workers it starts: neither of the two
# choices below is made, so the run trains as the same program does outside devprof.
TENSORFLOW_DEFAULTS_VAR = "DEVPROF_TENSORFLOW_DEFAULTS"


def keep_tensorflow_defaults(environ=None) -> None:
    (os.environ if environ is None else environ)[TENSORFLOW_DEFAULTS_VAR] = "1"


def prefer_onednn(environ=None) -> None:
    """Turn TensorFlow's oneDNN CPU kernels on unless the user chose (call before TensorFlow is
    imported; worker processes inherit it).

    TensorFlow turns them on itself only on x86 CPUs with AVX-512 VNNI, bfloat16 or AMX units.
    Elsewhere its Eigen kernels run the seed CNN's convolution gradients several times slower
    (epochs 1.4 to 2.4 times longer on a 2-core AVX2 EPYC), and a profiler that reports how
    near the device's limit a job runs should run the kernels that reach it.
    `TF_ENABLE_ONEDNN_OPTS=0` keeps Eigen's."""
    environ = os.environ if environ is None else environ
    if (
        ONEDNN_VAR in environ
        or environ.get(TENSORFLOW_DEFAULTS_VAR) == "1"
        or platform.machine().lower() not in ("x86_64", "amd64")
    ):
        return
    environ[ONEDNN_VAR] = "1"
    environ[_ONEDNN_BY_DEVPROF_VAR] = "1"


def onednn_state(environ=None) -> dict:
    """run.json `device.onednn_opts` (the variable as TensorFlow read it; null: TensorFlow's own
    choice for this CPU) and `device.onednn_set_by` (`devprof`, `user`, or null)."""
    environ = os.environ if environ is None else environ
    value = environ.get(ONEDNN_VAR)
    by = None if value is None else "devprof" if environ.get(_ONEDNN_BY_DEVPROF_VAR) == "1" else "user"
    return {"onednn_opts": value, "onednn_set_by": by}


def cpu_info() -> dict:
    import psutil

    return {
        "name": cpu_model(),
        "count": 1,
        "cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_bytes": psutil.virtual_memory().total,
        "strategy": "OneDeviceStrategy",
        # For analysis read from files: [] means bfloat16 runs emulated on this CPU.
        "bfloat16_units": bfloat16_units(cpu_flags()),
        **onednn_state(),
    }


def host_name() -> str:
    return socket.gethostname()


def describe_devices(backend: TFBackend | None = None, tpu: str | None = None) -> list[dict]:
    """What `devprof devices` lists: the CPU, each GPU, and a TPU where one is reachable."""
    backend = backend or TFBackend()
    rows = [{"kind": "cpu", **cpu_info()}]
    gpus = backend.physical_devices("GPU")
    memory = _gpu_memory(len(gpus)).get("memory_bytes_per_gpu", []) if gpus else []
    for i, gpu in enumerate(gpus):
        details = backend.gpu_details(gpu)
        row = {
            "kind": "gpu",
            "index": i,
            "name": details.get("device_name", gpu.name),
            "compute_capability": _cc(details.get("compute_capability")),
        }
        if i < len(memory):
            row["memory_bytes"] = memory[i]
        rows.append(row)
    if tpu_hint_present(tpu):
        try:
            rows.append({"kind": "tpu", **_resolve_tpu(backend, tpu).info})
        except DeviceError as exc:
            rows.append({"kind": "tpu", "name": "unavailable", "error": str(exc)})
    return rows
