"""`devprof devices`: the CPU, GPUs and TPU TensorFlow can use."""

from __future__ import annotations

import argparse
import json

from profiler.cli.common import EXIT_OK, add_format_option, with_schema


def add_parser(sub) -> argparse.ArgumentParser:
    devices = sub.add_parser(
        "devices",
        help="list the CPU, GPUs and TPU TensorFlow can use",
        description="List the CPU, the GPUs and a reachable TPU, with their memory and compute capability.",
    )
    add_format_option(devices, ("text", "json"), "output format", json_alias=True)
    devices.add_argument("--tpu", default=None, help="TPU name or address to look for")
    devices.set_defaults(handler=handle)
    return devices


def render_text(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        memory = f", {row['memory_bytes'] / 2**30:.1f} GiB" if row.get("memory_bytes") else ""
        if row["kind"] == "cpu":
            lines.append(f"cpu: {row['name']} ({row['cores']} logical cores{memory})")
        elif row["kind"] == "gpu":
            cc = f", compute capability {row['compute_capability']}" if row.get("compute_capability") else ""
            lines.append(f"gpu{row['index']}: {row['name']}{memory}{cc}")
        else:
            lines.append(f"tpu: {row.get('error') or row.get('name')}")
    if not any(r["kind"] == "gpu" for r in rows):
        lines.append("gpu: none found")
    return "\n".join(lines) + "\n"


def handle(args: argparse.Namespace) -> int:
    from profiler.device import devices

    rows = devices.describe_devices(tpu=args.tpu)
    if args.format == "json":
        print(json.dumps(with_schema({"devices": rows}), indent=2))
    else:
        print(render_text(rows), end="")
    return EXIT_OK
