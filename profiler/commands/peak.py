"""`devprof peak`: the device's matmul FLOP/s and memory bandwidth, measured once and cached."""

from __future__ import annotations

import argparse
import json
import math

from profiler.commands.common import EXIT_OK, add_format_option, error, warn, with_schema


def add_parser(sub) -> argparse.ArgumentParser:
    peak = sub.add_parser("peak", help="measure the device's matmul FLOP/s and memory bandwidth (cached)",
                          description="Measure the device's matmul FLOP/s and memory bandwidth with TensorFlow "
                                      "(cached per device; DEVPROF_CACHE_DIR moves the cache).")
    peak.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="device to measure (default: cpu)")
    add_format_option(peak, ("text", "json"), "output format", json_alias=True)
    peak.add_argument("--refresh", action="store_true", help="measure again even if a cached result exists")
    peak.set_defaults(handler=handle)
    return peak


def _si(value: float, unit: str) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(value) >= factor:
            return f"{value / factor:.1f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def render_text(peak: dict) -> str:
    lines = [f"{peak['device']}: {peak['device_name']}" + (" (cached)" if peak.get("cached") else "")]
    for dtype, rate in peak["matmul_flops_per_second"].items():
        n = peak.get("matmul", {}).get(dtype, {}).get("n")
        lines.append(f"  matmul {dtype}: {_si(rate, 'FLOP/s')}" + (f" (n={n})" if n else ""))
    for dtype, reason in peak.get("unsupported", {}).items():
        lines.append(f"  matmul {dtype}: not measured ({reason})")
    lines.append(f"  memory bandwidth: {_si(peak['memory_bytes_per_second'], 'B/s')}")
    if peak.get("cache"):
        lines.append(f"  cache: {peak['cache']}")
    return "\n".join(lines) + "\n"


def handle(args: argparse.Namespace) -> int:
    from profiler import peak as peak_mod
    from profiler import quiet

    quiet.import_tensorflow()
    try:
        peak = peak_mod.peak_for(args.device, refresh=args.refresh)
    except peak_mod.PeakError as exc:
        return error(str(exc))
    if peak.get("cache_error"):  # in every format: the next call measures again
        warn(peak_mod.not_cached_message(peak["cache_error"]))
    if args.format == "json":
        print(json.dumps(with_schema(peak), indent=2))
    else:
        print(render_text(peak), end="")
    return EXIT_OK
