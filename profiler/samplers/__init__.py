"""Samplers: host, GPU and TPU utilization recorded beside training, one CSV per sampler.

Build the set for a run with `build_sampler_group(run_dir / "utilization", device_kind)`,
`start()` it before training and `stop()` it after; `status()` and `summaries(epochs)` give
what run.json needs.
"""

from profiler.samplers.base import Sampler
from profiler.samplers.gpu import GpuSampler, discover_gpu_samplers
from profiler.samplers.host import HostSampler
from profiler.samplers.runner import (
    DEFAULT_INTERVAL_S,
    MIN_INTERVAL_S,
    SamplerGroup,
    SamplerThread,
    build_sampler_group,
    build_samplers,
    validate_interval,
)
from profiler.samplers.tpu import TpuSampler, discover_tpu_sampler, parse_monitor_output

__all__ = [
    "DEFAULT_INTERVAL_S",
    "MIN_INTERVAL_S",
    "GpuSampler",
    "HostSampler",
    "Sampler",
    "SamplerGroup",
    "SamplerThread",
    "TpuSampler",
    "build_sampler_group",
    "build_samplers",
    "discover_gpu_samplers",
    "discover_tpu_sampler",
    "parse_monitor_output",
    "validate_interval",
]
