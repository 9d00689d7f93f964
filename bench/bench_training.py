"""Speed of devprof's training loop against the seed program, side by side in one run.

Three configurations train the same seed CNN (`models.cnn.build_cnn`) on the same synthetic
images (`models.data.synthetic(N, 1000)`), batch 100, validating on 1,000 images every epoch:

  seed       the seed's Keras program: compile(adam, sparse_categorical_crossentropy, accuracy),
             fit(x / 255., y, batch_size=100, epochs=E, validation_data=(x_test[:1000] / 255., ...));
             epoch time (with validation) from a Keras callback, as Keras reports it
  devprof    models.training.Trainer on the CPU as `devprof run --device cpu` sets it up
             (profiler.device.devices.resolve), float32; EpochResult.seconds
  bf16       the same with precision="mixed_bfloat16"

Each run is a fresh subprocess (no TensorFlow state leaks between configurations) and the
configurations alternate within every repetition, so drift on the machine hits all of them.
Steady state = median of the epochs after the first (which holds tracing and warm-up).

The CPU's peak (`devprof peak`'s own measurement, `profiler.roofline.peak.measure_peak`: the better of
matmuls and convolutions, before, during and after the runs, the best kept) turns each configuration's throughput into a fraction of the matching peak:
achieved FLOP/s = train_flops_per_image x training images/s (training time without the
validation pass); the whole epoch's share adds the validation pass's forward FLOPs and
divides by the epoch's time.

Runs on the CPU only (CUDA_VISIBLE_DEVICES=-1 in every worker).

    .venv/bin/python bench/bench_training.py                  # 10,000 images, 3 epochs, 3 reps
    .venv/bin/python bench/bench_training.py --quick          # a smoke run, numbers meaningless
    .venv/bin/python bench/bench_training.py --configs seed,devprof --reps 5   # no bfloat16 units
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from profiler.device.devices import cpu_model  # noqa: E402

CONFIGS = ("seed", "seed-onednn", "devprof", "bf16")
LABELS = {
    "seed": "seed program (Keras `fit`, float32, TensorFlow's default CPU kernels)",
    "seed-onednn": "seed program with `TF_ENABLE_ONEDNN_OPTS=1`",
    "devprof": "devprof loop, float32",
    "bf16": "devprof loop, mixed_bfloat16",
}
PEAK_FOR = {"seed": "float32", "seed-onednn": "float32", "devprof": "float32", "bf16": "bfloat16"}
BATCH = 100
VALIDATION = 1_000
MARK = "BENCH_RESULT "


# ---------------------------------------------------------------- workers (one per subprocess)


def worker_train(config: str, images: int, epochs: int) -> dict:
    from models import cnn, data

    arrays = data.synthetic(images, VALIDATION, seed=0)
    if config.startswith("seed"):
        import keras

        keras.utils.set_random_seed(0)
        model = cnn.build_cnn("float32")
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])

        class EpochTimer(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.seconds, self.train_seconds = [], []

            def on_epoch_begin(self, epoch, logs=None):
                self.began = time.perf_counter()
                self.validation_began = None

            def on_test_begin(self, logs=None):  # fit's validation pass starts
                self.validation_began = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):  # after validation, as Keras reports the epoch
                end = time.perf_counter()
                self.seconds.append(end - self.began)
                self.train_seconds.append((self.validation_began or end) - self.began)

        timer = EpochTimer()
        model.fit(
            arrays.x_train / 255.0,
            arrays.y_train,
            batch_size=BATCH,
            epochs=epochs,
            validation_data=(arrays.x_test[:VALIDATION] / 255.0, arrays.y_test[:VALIDATION]),
            callbacks=[timer],
            verbose=2,
        )
        seconds, train_seconds = timer.seconds, timer.train_seconds
    else:
        from models.training import TrainConfig, Trainer

        precision = "mixed_bfloat16" if config == "bf16" else "float32"
        from profiler.device import devices

        strategy = devices.resolve("cpu").strategy  # as `devprof run --device cpu` sets the CPU up
        trainer = Trainer(
            strategy,
            cnn.build_cnn,
            arrays,
            TrainConfig(batch_size=BATCH, epochs=epochs, precision=precision, seed=0, validation_images=VALIDATION),
        )
        results = trainer.fit()
        model = trainer.model
        seconds = [r.seconds for r in results]
        train_seconds = [r.train_seconds for r in results]
    return {
        "config": config,
        "images": images,
        "seconds": seconds,
        "train_seconds": train_seconds,
        "flops_per_image": cnn.train_flops_per_image(model),
        "params": int(model.count_params()),
    }


def worker_peak() -> dict:
    """`devprof peak`'s measurement (profiler.roofline.peak.measure_peak), uncached: float32 and bfloat16 FLOP/s."""
    from profiler.roofline import peak

    result = peak.measure_peak("cpu", ("float32", "bfloat16"), bandwidth_bytes=64 * 2**20)
    out = {"measure_seconds": result["measure_seconds"]}
    for dtype in ("float32", "bfloat16"):
        out[dtype] = result["peak_flops_per_second"].get(dtype, float("nan"))
        out[f"{dtype}_matmul"] = result["matmul_flops_per_second"].get(dtype, float("nan"))
    return out


# ---------------------------------------------------------------- the parent


def kernels_env(config: str, environ) -> dict:
    """The seed as its user runs it (TensorFlow picks its CPU kernels), or with oneDNN's; devprof's
    loop and the peak with the kernels `devprof run` and `devprof peak` choose."""
    from profiler.device import devices

    env = {k: v for k, v in environ.items() if k not in (devices.ONEDNN_VAR, "DEVPROF_SET_ONEDNN_OPTS")}
    if config == "seed-onednn":
        env[devices.ONEDNN_VAR] = "1"
    elif config != "seed":
        devices.prefer_onednn(env)
    return env


def spawn(args: list[str], timeout: float) -> dict:
    env = dict(kernels_env(args[1], os.environ), CUDA_VISIBLE_DEVICES="-1", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    raise RuntimeError(f"worker {args} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def steady(values: list[float]) -> float:
    """Median of the epochs after the first; the only epoch when there is one."""
    return statistics.median(values[1:] if len(values) > 1 else values)


def fmt_range(values: list[float], digits: int = 2) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def report(runs: dict[str, list[dict]], peaks: list[dict], args, command: str, wall: float) -> str:
    peak = {d: max(p[d] for p in peaks) for d in ("float32", "bfloat16")}
    configs = [c for c in CONFIGS if runs.get(c)]
    reps = len(runs["seed"])
    lines = []
    lines.append(f"### Training loop vs the seed program ({time.strftime('%Y-%m-%d')})")
    lines.append("")
    lines.append(
        f"- machine: {cpu_model()}, {os.cpu_count()} logical cores, {platform.system()} "
        f"{platform.release()}; Python {platform.python_version()}, "
        f"TensorFlow {runs['seed'][0].get('tf', '?')}, Keras {runs['seed'][0].get('keras', '?')}"
    )
    lines.append(
        f"- {args.images:,} synthetic training images, batch {BATCH}, {VALIDATION:,} validation images, "
        f"{args.epochs} epochs per run, {reps} repetition(s), configurations alternated, "
        "each run in a fresh subprocess, CPU only"
    )
    lines.append(
        "- steady state = median of the epochs after the first in each run; over repetitions: median (min–max)"
    )
    matmul_peak = {d: max(p.get(f"{d}_matmul", p[d]) for p in peaks) for d in ("float32", "bfloat16")}
    lines.append(
        f"- peak (`devprof peak`'s measurement: the better of matmuls and 3x3 convolutions; measured "
        f"{len(peaks)}× in {min(p['measure_seconds'] for p in peaks):.0f}–"
        f"{max(p['measure_seconds'] for p in peaks):.0f} s, best kept): float32 {peak['float32'] / 1e9:.1f} "
        f"GFLOP/s, bfloat16 {peak['bfloat16'] / 1e9:.1f} GFLOP/s (each measurement: "
        + "; ".join(f"{p['float32'] / 1e9:.1f}" for p in peaks)
        + " float32); the matmuls alone: float32 "
        f"{matmul_peak['float32'] / 1e9:.1f} GFLOP/s"
    )
    lines.append(f"- train FLOPs per image: {runs['seed'][0]['flops_per_image']:,} (3× forward, 2 per multiply-add)")
    lines.append("")
    lines.append(
        "| configuration | s/epoch (with validation) | training images/s | achieved GFLOP/s "
        "| % of matching peak | whole epoch % of peak (validation included) "
        "| whole epoch % of the matmul peak | speed-up vs seed (seed s ÷ this s) |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for config in configs:
        epoch_s = [steady(r["seconds"]) for r in runs[config]]
        ips = [r["images"] / steady(r["train_seconds"]) for r in runs[config]]
        flops = [v * runs[config][0]["flops_per_image"] for v in ips]
        pct = [100 * f / peak[PEAK_FOR[config]] for f in flops]
        # The whole epoch: training FLOPs plus the validation pass's forward FLOPs (a third of training's).
        epoch_flops = [
            (r["images"] + VALIDATION / 3) * r["flops_per_image"] / steady(r["seconds"]) for r in runs[config]
        ]
        epoch_pct = [100 * f / peak[PEAK_FOR[config]] for f in epoch_flops]
        epoch_matmul_pct = [100 * f / matmul_peak[PEAK_FOR[config]] for f in epoch_flops]
        ratio = [steady(s["seconds"]) / steady(r["seconds"]) for s, r in zip(runs["seed"], runs[config])]
        lines.append(
            f"| {LABELS[config]} | {fmt_range(epoch_s)} | {fmt_range(ips, 0)} | "
            f"{fmt_range([f / 1e9 for f in flops], 1)} | {fmt_range(pct, 1)} % ({PEAK_FOR[config]}) | "
            f"{fmt_range(epoch_pct, 1)} % | {fmt_range(epoch_matmul_pct, 1)} % | "
            f"{'1 (reference)' if config == 'seed' else fmt_range(ratio) + '×'} |"
        )
    lines.append("")
    lines.append("Per run, seconds per epoch (first epoch included):")
    lines.append("")
    for config in configs:
        per_run = ["[" + ", ".join(f"{s:.2f}" for s in r["seconds"]) + "]" for r in runs[config]]
        lines.append(f"- {config}: {' '.join(per_run)}")
    lines.append("")
    lines.append(f"Command: `{command}` ({wall / 60:.1f} min)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--images", type=int, default=10_000, help="training images per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (steady state needs 2 or more)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the three configurations")
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="configurations to run (bf16 only means something on a CPU with bfloat16 units)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (300 images, 2 epochs, 1 rep)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds allowed per worker")
    parser.add_argument("--worker", choices=CONFIGS + ("peak",), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        if args.worker == "peak":
            result = worker_peak()
        else:
            import keras
            import tensorflow as tf

            result = worker_train(args.worker, args.images, args.epochs)
            result.update(tf=tf.__version__, keras=keras.__version__)
        print(MARK + json.dumps(result), flush=True)
        return 0
    if args.quick:
        args.images, args.epochs, args.reps = 300, 2, 1
    configs = tuple(c for c in CONFIGS if c in args.configs.split(","))
    if "seed" not in configs:
        parser.error("--configs must include seed (the reference)")
    if args.images < BATCH or args.epochs < 1 or args.reps < 1:
        parser.error("need --images >= 100, --epochs >= 1, --reps >= 1")

    command = shlex.join(
        [
            os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) else sys.executable,
            "bench/bench_training.py",
            *(argv if argv is not None else sys.argv[1:]),
        ]
    )
    began = time.perf_counter()
    peak_args = ["--worker", "peak"]
    peaks = [spawn(peak_args, args.timeout)]
    print(
        f"peak: float32 {peaks[0]['float32'] / 1e9:.1f} GFLOP/s, bfloat16 {peaks[0]['bfloat16'] / 1e9:.1f} GFLOP/s",
        file=sys.stderr,
        flush=True,
    )
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for rep in range(args.reps):
        order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
        for config in order:
            result = spawn(
                ["--worker", config, "--images", str(args.images), "--epochs", str(args.epochs)], args.timeout
            )
            runs[config].append(result)
            print(
                f"rep {rep + 1}/{args.reps} {config}: epochs "
                + ", ".join(f"{s:.2f}" for s in result["seconds"])
                + " s",
                file=sys.stderr,
                flush=True,
            )
        if args.reps > 2 and rep == args.reps // 2 - 1:  # the peak in the middle too: the best of three is kept
            peaks.append(spawn(peak_args, args.timeout))
    if args.reps > 1:
        peaks.append(spawn(peak_args, args.timeout))
    print(report(runs, peaks, args, command, time.perf_counter() - began))
    return 0


if __name__ == "__main__":
    sys.exit(main())
