"""Sampler overhead on training, and sampler memory over a long run.

1. Overhead: the same small TensorFlow training loop (conv + dense, fixed steps) timed
   alternately without and with every sampler of this machine running at `--interval`,
   `--reps` times each, so drift in machine speed hits both sides alike. Reports the
   median seconds of each side and their ratio, and the sampler threads' own CPU time per
   sample and as a share of all cores. With --sources proc,psutil the host sampler runs once
   with each counter source (Linux's /proc read directly, psutil), alternated.
2. Memory: all samplers at `--memory-interval` for `--memory-seconds`, before TensorFlow
   is imported, with this process's RSS recorded every few seconds. Flat RSS (growth
   near zero after the first seconds) shows that rows are streamed, not accumulated.

Prints markdown tables for BENCHMARKS.md. Run on a quiet machine:

    python bench/bench_samplers.py            # full: ~10 min on a laptop CPU
    python bench/bench_samplers.py --sources proc,psutil   # the host sampler's two sources
    python bench/bench_samplers.py --quick    # smoke run, seconds
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profiler.samplers import HostSampler, SamplerGroup, build_sampler_group, build_samplers  # noqa: E402
from profiler.samplers.host_sources import ProcSource, PsutilSource  # noqa: E402

MIB = 2**20


def measure_memory(seconds: float, interval_s: float, checkpoint_s: float) -> dict:
    """RSS of this process while every sampler runs at `interval_s` for `seconds`."""
    process = psutil.Process()
    with tempfile.TemporaryDirectory() as out_dir:
        group = build_sampler_group(out_dir, interval_s=interval_s)
        points = [(0.0, process.memory_info().rss)]
        start = time.monotonic()
        with group:
            next_checkpoint = checkpoint_s
            while (elapsed := time.monotonic() - start) < seconds:
                time.sleep(min(checkpoint_s, max(0.0, next_checkpoint - elapsed)))
                now = time.monotonic() - start
                if now >= next_checkpoint:
                    points.append((now, process.memory_info().rss))
                    next_checkpoint += checkpoint_s
        rows = {t.name: t.rows_written for t in group.threads}
        csv_bytes = sum(p.stat().st_size for p in Path(out_dir).glob("*.csv"))
    # Growth measured after the first checkpoint: allocator warm-up and imports settle there.
    settled = points[1:] if len(points) > 2 else points
    times = [t for t, _ in settled]
    rss = [r for _, r in settled]
    slope = 0.0
    if len(settled) > 1 and max(times) > min(times):
        mean_t, mean_r = statistics.fmean(times), statistics.fmean(rss)
        slope = sum((t - mean_t) * (r - mean_r) for t, r in settled) / sum((t - mean_t) ** 2 for t in times)
    return {
        "points": points,
        "rows": rows,
        "csv_bytes": csv_bytes,
        "growth_bytes": rss[-1] - rss[0],
        "slope_bytes_per_min": slope * 60.0,
    }


def make_training_step(batch_size: int):
    """A compiled train step of a small CNN on one fixed random batch (CPU or GPU)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.random.set_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((32, 32, 3)),
            tf.keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
            tf.keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(64, 3, activation="relu", padding="same"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(10),
        ]
    )
    optimizer = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    images = tf.random.uniform((batch_size, 32, 32, 3))
    labels = tf.random.uniform((batch_size,), maxval=10, dtype=tf.int32)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def run(steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            loss = step()
        float(loss)  # wait for the device
        return time.perf_counter() - start

    run(3)  # trace and compile outside the timings
    return run


SOURCES = {"proc": ProcSource, "psutil": PsutilSource}


def sampler_group(out_dir: str, interval_s: float, source: str | None) -> SamplerGroup:
    """Every sampler of this machine, the host one reading its counters from `source` (default: its own)."""
    if source is None:
        return build_sampler_group(out_dir, interval_s=interval_s)
    samplers, unavailable = build_samplers()
    samplers = [HostSampler(source=SOURCES[source]()) if isinstance(s, HostSampler) else s for s in samplers]
    return SamplerGroup(samplers, out_dir, interval_s, unavailable=unavailable)


def measure_overhead(steps: int, reps: int, interval_s: float, batch_size: int, sources: list[str]) -> dict:
    """Training time without samplers and with them (once per host source), alternated; the samplers' CPU time."""
    run = make_training_step(batch_size)
    sides = ["off", *sources]
    times: dict[str, list[float]] = {side: [] for side in sides}
    cpu_s: dict[str, list[float]] = {side: [] for side in sources}
    samples: dict[str, list[int]] = {side: [] for side in sources}
    samplers_used: list[str] = []

    def with_samplers(source):
        with tempfile.TemporaryDirectory() as out_dir:
            group = sampler_group(out_dir, interval_s, None if source == "default" else source)
            samplers_used[:] = [t.name for t in group.threads]
            with group:
                times[source].append(run(steps))
            cpu_s[source].append(sum(t.cpu_s for t in group.threads))
            samples[source].append(sum(t.rows_written for t in group.threads))

    for rep in range(reps):
        # Rotate which side goes first, so none always runs on a warmer machine.
        shift = rep % len(sides)
        for side in sides[shift:] + sides[:shift]:
            if side == "off":
                times["off"].append(run(steps))
            else:
                with_samplers(side)
    return {"times": times, "samplers": samplers_used, "sampler_cpu_s": cpu_s, "samples": samples}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps per timed run")
    parser.add_argument("--reps", type=int, default=7, help="timed runs per side (with / without samplers)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--interval", type=float, default=0.1, help="sampling interval for the overhead runs (s)")
    parser.add_argument("--memory-seconds", type=float, default=60.0)
    parser.add_argument("--memory-interval", type=float, default=0.05)
    parser.add_argument(
        "--sources", default="proc,psutil", help="host counter sources to run side by side (proc, psutil, default)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.reps, args.memory_seconds = 10, 2, 3.0
    checkpoint_s = max(1.0, args.memory_seconds / 12)

    memory = measure_memory(args.memory_seconds, args.memory_interval, checkpoint_s)
    sources = [part for part in args.sources.split(",") if part]
    overhead = measure_overhead(args.steps, args.reps, args.interval, args.batch_size, sources)

    times = overhead["times"]
    off_s = statistics.median(times["off"])
    cores = os.cpu_count() or 1
    print(f"## Sampler overhead ({cores} CPU cores, {psutil.virtual_memory().total / 2**30:.0f} GiB)")
    print()
    print(
        f"Samplers: {', '.join(overhead['samplers'])} at {args.interval} s; "
        f"{args.steps} steps of batch {args.batch_size} per run, {args.reps} runs per side, alternating."
    )
    print()
    print(
        "| | median s | min s | max s | steps/s | with / without | sampler CPU ms per sample | "
        "sampler CPU % of all cores |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for side, side_times in times.items():
        median = statistics.median(side_times)
        label = "without samplers" if side == "off" else f"with samplers, host counters from {side}"
        cells = ["–", "–", "–"]
        if side != "off":
            cpu, rows = sum(overhead["sampler_cpu_s"][side]), sum(overhead["samples"][side])
            # Per run: the threads' CPU seconds over the run's wall time on every core.
            shares = [100 * c / (t * cores) for c, t in zip(overhead["sampler_cpu_s"][side], side_times)]
            cells = [
                f"{median / off_s:.3f}",
                f"{1e3 * cpu / max(rows, 1):.3f}",
                f"**{statistics.median(shares):.3f}** ({min(shares):.3f}–{max(shares):.3f})",
            ]
        print(
            f"| {label} | {median:.3f} | {min(side_times):.3f} | {max(side_times):.3f} | "
            f"{args.steps / median:.1f} | " + " | ".join(cells) + " |"
        )
    print()
    print(
        "Sampler CPU: the sampler threads' own CPU time (`time.thread_time`, recorded by each thread), "
        "noise-free unlike the wall-clock ratio."
    )
    print()
    print(f"## Sampler memory ({args.memory_seconds:.0f} s at {args.memory_interval} s, before TensorFlow import)")
    print()
    print("| t (s) | RSS (MiB) |")
    print("|---:|---:|")
    for t, rss in memory["points"]:
        print(f"| {t:.1f} | {rss / MIB:.1f} |")
    print()
    rows = ", ".join(f"{name} {count}" for name, count in memory["rows"].items())
    print(
        f"Rows written: {rows} ({memory['csv_bytes'] / MIB:.2f} MiB of CSV). "
        f"RSS growth after the first checkpoint: {memory['growth_bytes'] / MIB:+.2f} MiB "
        f"(trend {memory['slope_bytes_per_min'] / MIB:+.3f} MiB/min)."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
