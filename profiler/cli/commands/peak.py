"""`devprof peak`: the device's matrix and vector FLOP/s and memory bandwidth per dtype, measured once and cached."""

from __future__ import annotations

import argparse
import json
import math

from profiler.cli.common import EXIT_OK, add_format_option, error, warn, with_schema


def add_parser(sub) -> argparse.ArgumentParser:
    peak = sub.add_parser(
        "peak",
        help="measure the device's matrix and vector FLOP/s and memory bandwidth (cached)",
        description="Measure the device's matrix (matmul, convolution) and vector FLOP/s and its "
        "memory bandwidth per dtype with TensorFlow (cached per device; "
        "DEVPROF_CACHE_DIR moves the cache).",
    )
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


STOPPED = {
    "growth": "the next size added < 3 %",
    "time": "a larger one would take too long",
    "sizes": "the largest size tried",
}


def _search(detail: dict, what: str = "sizes") -> str:
    """'; sizes 512-4096, stopped: ...' where the measurement says how its sizes went."""
    sizes = [row.get("size") for row in detail.get("sizes") or []]
    if not sizes or detail.get("stopped") not in STOPPED:
        return ""
    return f"; {what} {sizes[0]}–{sizes[-1]}, stopped: {STOPPED[detail['stopped']]}"


def render_text(peak: dict) -> str:
    lines = [f"{peak['device']}: {peak['device_name']}" + (" (cached)" if peak.get("cached") else "")]
    ceilings = peak.get("ceilings") or {
        dtype: {"matrix_flops_per_second": rate} for dtype, rate in (peak.get("peak_flops_per_second") or {}).items()
    }
    for dtype, ceiling in ceilings.items():
        source = (peak.get("peak_source") or {}).get(dtype, "matmul")
        line = (
            f"  {dtype}: matrix {_si(ceiling.get('matrix_flops_per_second'), 'FLOP/s')} "
            f"(from the {'convolutions' if source == 'conv' else 'matmuls'})"
        )
        if "vector_flops_per_second" in ceiling:
            line += (
                f", vector {_si(ceiling['vector_flops_per_second'], 'FLOP/s')}, "
                f"memory {_si(ceiling.get('memory_bytes_per_second'), 'B/s')}"
            )
        lines.append(line)
    for dtype, rate in peak["matmul_flops_per_second"].items():
        detail = peak.get("matmul", {}).get(dtype, {})
        n = detail.get("n")
        lines.append(f"    matmul {dtype}: {_si(rate, 'FLOP/s')}" + (f" (n={n}{_search(detail)})" if n else ""))
        conv = (peak.get("conv") or {}).get(dtype) or {}
        if conv.get("error"):
            lines.append(f"    conv {dtype}: not measured ({conv['error']})")
        elif conv.get("channels"):
            lines.append(
                f"    conv {dtype}: {_si(peak['conv_flops_per_second'][dtype], 'FLOP/s')} "
                f"(3x3, {conv['channels']} channels{_search(conv, 'channels')})"
            )
        vector = (peak.get("vector") or {}).get(dtype) or {}
        if vector.get("error"):
            lines.append(f"    vector {dtype}: not measured ({vector['error']})")
        elif vector.get("k"):
            unfused = f"; unfused: {vector.get('fusion_error')}" if vector.get("fused") is False else ""
            lines.append(
                f"    vector {dtype}: {_si(ceilings[dtype].get('vector_flops_per_second'), 'FLOP/s')} "
                f"(K={vector['k']} multiply-adds per element{_search(vector, 'K')}{unfused})"
            )
    for dtype, reason in peak.get("unsupported", {}).items():
        lines.append(f"  {dtype}: not measured ({reason})")
    lines.append(f"  memory bandwidth: {_si(peak['memory_bytes_per_second'], 'B/s')}")
    if peak.get("measure_seconds") is not None:
        when = f" at {peak['measured_at']}" if peak.get("measured_at") else ""
        lines.append(f"  measured in {peak['measure_seconds']:.0f} s{when}")
    if peak.get("cache"):
        lines.append(f"  cache: {peak['cache']}")
    return "\n".join(lines) + "\n"


def handle(args: argparse.Namespace) -> int:
    from profiler.device import devices, quiet
    from profiler.roofline import peak as peak_mod

    devices.prefer_onednn()  # the kernels `devprof run` trains with
    quiet.import_tensorflow()
    try:
        # TensorFlow's native log lines while the kernels run, and its retracing warnings for the sizes tried
        with quiet.filtered_stderr(), quiet.tensorflow_python_warnings_off():
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
