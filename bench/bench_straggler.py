"""The straggler rule on a busy machine: two-worker ground-truth jobs beside a CPU hog.

Each round runs, while one busy-loop process per `--hog` spins on the CPU:
1. plain: `devprof run --workers 2` with nothing injected; right when analyze names no
   straggler, or one whose cause is `contention`;
2. host: the same with `--inject-host-delay-ms 40@1`; right when analyze names worker 1,
   cause `host`.
The jobs are those of tests/e2e/test_workers.py (400 synthetic images, global batch 20, steps
4..19 traced). Prints one row per job and the count of right answers, as markdown for
BENCHMARKS.md:

    python bench/bench_straggler.py              # 5 rounds beside 1 hog: ~10 min on 2 cores
    python bench/bench_straggler.py --rounds 1 --hogs 0
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = [
    "--workers",
    "2",
    "--device",
    "cpu",
    "--data",
    "synthetic",
    "--limit-images",
    "400",
    "--limit-test-images",
    "200",
    "--batch-size",
    "20",
    "--sample-interval",
    "0.2",
    "--epochs",
    "1",
    "--profile-steps",
    "4:20",
]
CASES = {"plain": [], "host": ["--inject-host-delay-ms", "40@1"]}


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def devprof(*args: str | Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("TF_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "profiler", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def right(case: str, straggler: dict | None) -> bool:
    if case == "plain":
        return straggler is None or straggler["cause"] == "contention"
    return straggler is not None and straggler["worker"] == 1 and straggler["cause"] == "host"


def one_job(out: Path, case: str, index: int) -> dict:
    name = f"{case}-{index}"
    began = time.monotonic()
    ran = devprof("run", *JOB, "--out", out, "--run-name", name, *CASES[case])
    if ran.returncode != 0:
        return {"case": case, "ok": False, "straggler": None, "reason": f"run failed: {ran.stderr.strip()[-200:]}"}
    analysed = devprof("analyze", out / name, "--format", "json")
    result = json.loads(analysed.stdout)
    straggler = result["straggler"]
    workers = {row["worker"]: row for row in result["workers"]}
    return {
        "case": case,
        "ok": right(case, straggler),
        "straggler": straggler,
        "reason": result.get("straggler_reason"),
        "seconds": time.monotonic() - began,
        "other_cpu_pct": result["utilization"].get("other_cpu_mean_pct"),
        "own_ms": [round(w["step_ms"] - w["collective_ms"], 1) for w in workers.values()],
        "noise_ms": [None if w.get("own_noise_ms") is None else round(w["own_noise_ms"], 1) for w in workers.values()],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hogs", type=int, default=1, help="busy-loop processes beside the jobs")
    args = parser.parse_args(argv)
    stop = multiprocessing.Event()
    hogs = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as folder:
            for index in range(args.rounds):
                for case in CASES:
                    rows.append(one_job(Path(folder), case, index))
                    print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        stop.set()
        for hog in hogs:
            hog.join(5)
    print(f"{args.rounds} rounds beside {args.hogs} busy-loop process(es), {os.cpu_count()} cores\n")
    print("| job | straggler | cause | other CPU % | own step ms (w0, w1) | noise ms | right |")
    print("|---|---|---|---:|---|---|---|")
    for row in rows:
        s = row["straggler"]
        other = row.get("other_cpu_pct")
        print(
            f"| {row['case']} | {s['worker'] if s else 'none'} | {s['cause'] if s else (row['reason'] or '')[:60]} | "
            f"{'-' if other is None else f'{other:.0f}'} | {row.get('own_ms')} | {row.get('noise_ms')} | "
            f"{'yes' if row['ok'] else 'NO'} |"
        )
    for case in CASES:
        done = [row for row in rows if row["case"] == case]
        print(f"\n{case}: {sum(row['ok'] for row in done)} of {len(done)} right")
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
