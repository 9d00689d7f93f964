"""Several workers in one job: the cluster from `TF_CONFIG` or `--cluster`, which worker this
process is, its share of the machine, and `MS@WORKER` injections.

Nothing here imports TensorFlow: the cluster must be known (and `TF_CONFIG` set) before
TensorFlow starts, because `MultiWorkerMirroredStrategy` reads it when it is created.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import NamedTuple

TF_CONFIG = "TF_CONFIG"
WORKER_PREFIX = "worker-"  # analysis/run_files.py reads the same folder names
TASK_TYPES = ("chief", "worker")  # the tasks MultiWorkerMirroredStrategy trains on, chief first


class ClusterError(ValueError):
    """A cluster description that cannot work (a usage error, exit code 2)."""


@dataclass(frozen=True)
class Cluster:
    """Every worker's `host:port` (the chief first) and which one this process is."""

    workers: tuple[str, ...]
    index: int
    source: str  # "TF_CONFIG" or "--cluster"
    tf_config: str  # the JSON this process gives TensorFlow

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    @property
    def name(self) -> str:
        """This worker's folder in the job's run directory: `worker-<i>`."""
        return worker_name(self.index)

    def local_workers(self) -> int:
        """How many of the job's workers run on this machine (this one included)."""
        mine = local_addresses()
        return max(1, sum(split_address(address)[0].lower() in mine for address in self.workers))

    def as_dict(self) -> dict:
        return {"workers": list(self.workers), "index": self.index, "source": self.source}


def worker_name(index: int) -> str:
    return f"{WORKER_PREFIX}{index}"


def split_address(address: str) -> tuple[str, int]:
    """`host:port` (IPv6 as `[::1]:port`) -> (host, port); raises ClusterError."""
    text = address.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ClusterError(f"worker address {address!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ClusterError(f"worker address {address!r}: write an IPv6 host in brackets, as [::1]:PORT")
    try:
        port = int(port_text)
    except ValueError:
        raise ClusterError(f"worker address {address!r}: port {port_text!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise ClusterError(f"worker address {address!r}: port must be from 1 to 65535")
    return host, port


def _check_workers(workers: list[str], where: str) -> tuple[str, ...]:
    if not workers:
        raise ClusterError(f"{where} lists no workers")
    seen = set()
    for address in workers:
        if not isinstance(address, str):
            raise ClusterError(f"{where}: worker address {address!r} is not a string")
        host, port = split_address(address)
        key = (host.lower(), port)
        if key in seen:
            raise ClusterError(f"{where} lists {address} twice")
        seen.add(key)
    return tuple(workers)


def _check_index(index, count: int, where: str) -> int:
    if isinstance(index, bool) or not isinstance(index, int):
        raise ClusterError(f"{where}: the task index must be a whole number (got {index!r})")
    if not 0 <= index < count:
        raise ClusterError(
            f"{where}: task index {index} is out of range: the cluster has {count} "
            f"worker{'s' if count != 1 else ''} (0..{count - 1})"
        )
    return index


def from_tf_config(text: str) -> Cluster:
    """The cluster `TF_CONFIG` describes: `{"cluster": {"worker": [...]} (and an optional
    "chief": [one]), "task": {"type": "worker", "index": i}}`. The chief is worker 0."""
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ClusterError(f"TF_CONFIG is not valid JSON ({exc})") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise ClusterError(
            'TF_CONFIG needs a "cluster" object, e.g. {"cluster": {"worker": ["host1:12345", '
            '"host2:12345"]}, "task": {"type": "worker", "index": 0}}'
        )
    spec = config["cluster"]
    other = sorted(set(spec) - set(TASK_TYPES))
    if other:
        raise ClusterError(
            f"TF_CONFIG's cluster has {', '.join(repr(t) for t in other)} tasks; devprof trains with "
            "MultiWorkerMirroredStrategy, whose cluster has only 'chief' and 'worker' tasks"
        )
    chief = spec.get("chief") or []
    workers = spec.get("worker") or []
    if not isinstance(chief, list) or not isinstance(workers, list):
        raise ClusterError("TF_CONFIG: the cluster's 'chief' and 'worker' entries must be lists of HOST:PORT")
    if len(chief) > 1:
        raise ClusterError(f"TF_CONFIG lists {len(chief)} chiefs; a cluster has at most one")
    every = _check_workers([*chief, *workers], "TF_CONFIG's cluster")
    task = config.get("task")
    if not isinstance(task, dict) or task.get("type") not in TASK_TYPES:
        raise ClusterError(
            'TF_CONFIG needs a "task" such as {"type": "worker", "index": 0} saying which worker this host is'
        )
    kind = task["type"]
    if kind == "chief":
        if not chief:
            raise ClusterError("TF_CONFIG's task is the chief, but the cluster lists no chief")
        index = _check_index(task.get("index", 0), 1, "TF_CONFIG (chief)")
    else:
        index = len(chief) + _check_index(task.get("index"), len(workers), "TF_CONFIG")
    return Cluster(every, index, "TF_CONFIG", text)


def from_option(text: str, task_index: int | None) -> Cluster:
    """`--cluster host1:port,host2:port --task-index i`, and the TF_CONFIG it stands for."""
    if task_index is None:
        raise ClusterError("--cluster needs --task-index (which worker this host is, 0 is the chief)")
    workers = [part.strip() for part in text.split(",")]
    if any(not part for part in workers):
        raise ClusterError(f"--cluster {text!r}: an empty worker address (write HOST:PORT,HOST:PORT)")
    every = _check_workers(workers, "--cluster")
    index = _check_index(task_index, len(every), "--task-index")
    config = {"cluster": {"worker": list(every)}, "task": {"type": "worker", "index": index}}
    return Cluster(every, index, "--cluster", json.dumps(config))


def local_tf_config(ports: list[int], index: int) -> str:
    """TF_CONFIG for worker `index` of a job on this machine (one 127.0.0.1 port each)."""
    return json.dumps(
        {"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]}, "task": {"type": "worker", "index": index}}
    )


def resolve(cluster_option: str | None, task_index: int | None, environ=None) -> Cluster | None:
    """The cluster this process belongs to (`--cluster` first, then TF_CONFIG), or None."""
    environ = os.environ if environ is None else environ
    if cluster_option is not None:
        return from_option(cluster_option, task_index)
    text = environ.get(TF_CONFIG)
    if not text:
        if task_index is not None:
            raise ClusterError("--task-index needs --cluster (or TF_CONFIG in the environment)")
        return None
    cluster = from_tf_config(text)
    if task_index is not None and task_index != cluster.index:
        raise ClusterError(
            f"--task-index {task_index} disagrees with TF_CONFIG, which makes this host worker {cluster.index}"
        )
    return cluster


def local_addresses() -> set[str]:
    """Names and addresses this machine answers to."""
    names = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}
    for name in (socket.gethostname(), socket.getfqdn()):
        if name:
            names.add(name.lower())
    try:
        import psutil

        for addresses in psutil.net_if_addrs().values():
            names.update(a.address.split("%")[0].lower() for a in addresses if a.address)
    except Exception:  # noqa: BLE001 - a guess is enough: it only sets the thread counts
        pass
    return names


def thread_counts(local_workers: int, cores: int | None = None) -> tuple[int, int] | None:
    """(intra-op, inter-op) threads for one of `local_workers` workers sharing this machine's cores,
    or None when the worker has the machine to itself (TensorFlow's defaults are right then)."""
    if local_workers <= 1:
        return None
    cores = cores or os.cpu_count() or 1
    share = max(1, cores // local_workers)
    return share, 1 if share <= 2 else 2


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports nothing listens on now (the OS picks them)."""
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return ports


# ---------------------------------------------------------------- MS@WORKER


class Injection(NamedTuple):
    """An injected cost: `ms` per step, on one worker (`worker`) or on every worker (None)."""

    ms: float
    worker: int | None = None

    def __str__(self) -> str:
        ms = f"{self.ms:g}"
        return ms if self.worker is None else f"{ms}@{self.worker}"

    def for_worker(self, index: int | None) -> float:
        """The cost worker `index` pays (a single-process run is `index` None)."""
        return self.ms if self.worker is None or self.worker == index else 0.0


def parse_injection(text: str) -> Injection:
    """`30` (every worker) or `30@1` (worker 1 only); raises ValueError. The number is checked
    (finite, >= 0) with the other float options, the worker against the job's size."""
    ms_text, sep, worker_text = str(text).strip().partition("@")
    try:
        ms = float(ms_text)
    except ValueError:
        raise ValueError(f"wants MS or MS@WORKER (e.g. 30, or 30@1 for worker 1 only), got {text!r}") from None
    if not sep:
        return Injection(ms)
    try:
        worker = int(worker_text)
    except ValueError:
        raise ValueError(f"wants MS@WORKER with a worker number (e.g. 30@1), got {text!r}") from None
    if worker < 0:
        raise ValueError(f"worker must be 0 or more, got {text!r}")
    return Injection(ms, worker)


def check_injection(option: str, injection: Injection, num_workers: int | None) -> str | None:
    """Why `injection` cannot apply to a job of `num_workers` workers (None: one process), or None."""
    if injection.worker is None:
        return None
    if num_workers is None:
        return (
            f"{option} {injection} names worker {injection.worker}, but this run has one worker "
            f"(use --workers N, --cluster or TF_CONFIG; or give {option} without @WORKER)"
        )
    if injection.worker >= num_workers:
        return (
            f"{option} {injection}: there is no worker {injection.worker}; the job has {num_workers} "
            f"workers (0..{num_workers - 1})"
        )
    return None
