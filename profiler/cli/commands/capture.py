"""`devprof capture`: trace a running job through its profiler server."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from profiler.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    DefaultsHelpFormatter,
    add_tracer_options,
    error,
    tracer_options,
    warn,
)


def add_parser(sub) -> argparse.ArgumentParser:
    capture = sub.add_parser(
        "capture",
        help="capture a trace from a running job's profiler server",
        description="Trace a job started with 'devprof run --profiler-port PORT' (or any "
        "TensorFlow job running a profiler server) for a while.",
        formatter_class=DefaultsHelpFormatter,
    )
    capture.add_argument(
        "address",
        help="grpc://HOST:PORT of a job started with --profiler-port; several workers "
        "as grpc://HOST1:PORT1,grpc://HOST2:PORT2 (one session, one trace per host)",
    )
    capture.add_argument("--duration-ms", type=int, default=2000, help="how long to trace")
    capture.add_argument(
        "--out",
        metavar="DIR",
        default="runs/captures",
        help="folder captures go into; the trace lands in DIR/plugins/profile/",
    )
    add_tracer_options(capture)
    capture.set_defaults(handler=handle)
    return capture


MAX_DURATION_MS = 2**31 - 1  # the capture client takes a 32-bit count of milliseconds


def handle(args: argparse.Namespace) -> int:
    from profiler.record import rundir, tracing

    address = args.address
    try:
        targets = tracing.parse_service_addresses(address)
    except ValueError as exc:
        return error(str(exc))
    # Checked here, not by the profiler server, whose INVALID_ARGUMENT would read as a connection problem.
    if not 1 <= args.duration_ms <= MAX_DURATION_MS:
        return error(
            f"--duration-ms must be a whole number of milliseconds from 1 to {MAX_DURATION_MS} (got {args.duration_ms})"
        )
    try:
        rundir.check_output_folder(Path(args.out))
    except rundir.OutputError as exc:
        return error(str(exc))
    os.makedirs(args.out, exist_ok=True)
    print(f"capturing {args.duration_ms} ms from {address} ...", file=sys.stderr)
    options = tracer_options(args)
    try:
        tracing.capture(
            address,
            args.out,
            args.duration_ms,
            options.host_tracer_level,
            options.device_tracer_level,
            options.python_tracer_level,
        )
    except Exception as exc:  # noqa: BLE001
        first = str(exc).strip().splitlines()
        return error(
            f"capture from {address} failed: {first[0] if first else type(exc).__name__}",
            hint="is the job running with --profiler-port?",
            code=EXIT_FAILURE,
        )
    trace = tracing.newest_xplane(args.out)
    if trace is not None and len(targets) > 1:
        found = sorted(trace.parent.glob("*.xplane.pb"))
        print(
            f"traces written: {len(found)} in {trace.parent}"
            + ("" if len(found) == len(targets) else f" (expected one per host: {len(targets)})")
        )
        silent = hosts_without_trace(targets, [path.name for path in found])
        if silent:
            # The profiler server writes no file for a host that recorded no event in the window.
            warn(
                f"no trace from {', '.join(silent)}: it recorded nothing in {args.duration_ms} ms (blocked, or "
                "between steps, the whole time?); capture again with a longer --duration-ms"
            )
        return EXIT_OK
    print(f"trace written: {trace}" if trace else f"capture finished; traces are under {args.out}/plugins/profile")
    return EXIT_OK


def hosts_without_trace(targets: list[str], trace_names: list[str]) -> list[str]:
    """The targets (grpc://HOST:PORT) without a HOST_PORT.xplane.pb among `trace_names`."""
    written = {name.removesuffix(".xplane.pb") for name in trace_names}
    return [target for target in targets if target.removeprefix("grpc://").replace(":", "_") not in written]
