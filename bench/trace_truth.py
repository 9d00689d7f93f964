"""devprof beside its oracles on every trace under some folders: one row per trace.

    .venv/bin/python bench/trace_truth.py ../shared/traces runs/ [--make DIR] [--markdown]

For each `.xplane.pb` it prints the steps devprof found (complete ones, and how), the steps
XProf's converter finds (`input_pipeline_analyzer`, in a fresh process: it can crash on
traces it does not expect) and the trace's own step grouping (a device `Steps` line, host
`group_id`s), the mean step on the host and on the busiest device, that device's busy time
per step, and the input share by devprof and by XProf. `disagree` names every figure
outside tolerance: step counts that differ, a mean step more than 5 % apart, input shares
more than 3 points apart, device busy above its step. `--make DIR` first writes synthetic
traces there (asynchronous devices, empty planes, copy streams under compute, several
programs, CUDA/ROCm/TPU) and includes them.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "support")]

STEP_TOLERANCE = 0.05
INPUT_POINTS = 3.0
XPROF_SCRIPT = """
import json, sys
sys.path[:0] = [sys.argv[2]]
from xprof_oracle import xprof_steps
steps, summary = xprof_steps(sys.argv[1])
print(json.dumps({"steps": len(steps), "numbers": [int(s) for s in steps["step"]],
                  "step_ms": [float(v) for v in steps["step_ms"]] if len(steps) else [],
                  "input_ms": [float(v) for v in steps["input_ms"]] if len(steps) and "input_ms" in steps else []}))
"""


def xprof(path: Path, timeout: int = 600) -> dict:
    try:
        done = subprocess.run(
            [sys.executable, "-c", XPROF_SCRIPT, str(path), str(REPO / "tests" / "support")],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": "timeout"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1][:80]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def own_grouping(view) -> int | None:
    """Steps by the trace's own grouping: events on the busiest device `Steps` line, else host group ids."""
    steps_line = view.on_device
    steps_line = steps_line[steps_line["line_name"] == "Steps"]
    if not steps_line.empty:
        return int(steps_line["plane"].value_counts().iloc[0])
    groups = view.host["group_id"].dropna()
    return int(groups.nunique()) if len(groups) else None


def devprof_row(path: Path) -> dict:
    from analysis.worker import analyze_worker

    result = analyze_worker(path)
    recorded = result.devices[result.devices["recorded"].astype(bool)] if not result.devices.empty else result.devices
    busiest = recorded.sort_values("compute_ms", ascending=False).iloc[0] if len(recorded) else None
    busy = (
        float(busiest[["compute_ms", "input_ms", "copy_ms", "collective_ms"]].sum())
        if busiest is not None
        else math.nan
    )
    steady = result.steps[~result.steps["partial"].astype(bool)]
    return {
        "source": result.step_source,
        "steps": int(result.steps_used),
        "per_step": steady,
        "all_steps": len(result.steps),
        "step_ms": result.mean["step_ms"],
        "device_step_ms": result.mean.get("device_step_ms", math.nan),
        "device_busy_ms": busy,
        "device_step_of_busiest": float(busiest["step_ms"]) if busiest is not None else math.nan,
        "input_pct": result.mean["input_pct"],
        "own": own_grouping(trace_view(path)),
        "not_recorded": int((~result.devices["recorded"].astype(bool)).sum()) if not result.devices.empty else 0,
    }


def trace_view(path: Path):
    from analysis.read.trace import read_trace
    from analysis.read.view import TraceView

    return TraceView(read_trace(path))


def xprof_summary(ours: dict, theirs: dict) -> dict:
    """XProf's mean step and input share over the steps both found (XProf leaves out steps its
    event grouping cannot close, often the first and last of the window)."""
    if not theirs.get("steps"):
        return {}
    frame = pd.DataFrame({"step": theirs["numbers"], "step_ms": theirs["step_ms"]})
    frame["input_ms"] = theirs["input_ms"] if theirs["input_ms"] else math.nan
    mine = ours["per_step"]
    common = frame[frame["step"].isin(mine["step"])]
    missing = sorted(set(frame["step"]) - set(mine["step"]))
    mine = mine[mine["step"].isin(common["step"])]
    if common.empty:
        return {"missing": missing}
    return {
        "missing": missing,
        "step_ms": float(common["step_ms"].mean()),
        "our_step_ms": float(mine["step_ms"].mean()),
        "input_pct": 100.0 * float(common["input_ms"].sum()) / float(common["step_ms"].sum()),
        "our_input_pct": 100.0 * float(mine["input_ms"].sum()) / float(mine["step_ms"].sum()),
    }


def disagreements(ours: dict, theirs: dict) -> list[str]:
    out = []
    summary = xprof_summary(ours, theirs)
    if summary.get("missing"):
        out.append(f"xprof has steps devprof does not: {summary['missing'][:5]}")
    if "step_ms" in summary:
        device = ours["device_step_ms"]
        near = [
            v
            for v in (summary["our_step_ms"], device)
            if v == v and abs(v - summary["step_ms"]) <= STEP_TOLERANCE * summary["step_ms"]
        ]
        if not near:
            out.append(f"step {summary['our_step_ms']:.3g} (device {device:.3g}) vs xprof {summary['step_ms']:.3g} ms")
        if (
            summary["input_pct"] == summary["input_pct"]
            and abs(summary["our_input_pct"] - summary["input_pct"]) > INPUT_POINTS
        ):
            out.append(f"input {summary['our_input_pct']:.1f} vs xprof {summary['input_pct']:.1f} %")
    if ours["own"] is not None and ours["source"] == "trace_groups" and ours["own"] != ours["all_steps"]:
        out.append(f"steps {ours['all_steps']} vs the trace's own {ours['own']}")
    if ours["device_busy_ms"] > ours["device_step_of_busiest"] * (1 + 1e-9):
        out.append("device busy above its step")
    return out


def make_traces(folder: Path) -> None:
    import trace_fixtures as fx
    import truth_fixtures as tx

    folder.mkdir(parents=True, exist_ok=True)
    for producer in ("cuda", "rocm", "tpu"):
        fx.write_synthetic_device_trace(folder / f"sync-{producer}" / "h.xplane.pb", producer=producer)
    fx.write_synthetic_device_trace(folder / "cuda-steps-line" / "h.xplane.pb", steps_line=True)
    fx.write_synthetic_session(folder / "session-3-workers")
    fx.write_grouped_host_trace(folder / "host-groups" / "h.xplane.pb")
    fx.write_unrepeated_trace(folder / "unrepeated" / "h.xplane.pb")
    fx.write_two_function_trace(folder / "two-functions" / "h.xplane.pb")
    tx.write_tf_gpu_loop(folder / "gpu-behind-host" / "h.xplane.pb", host_step_ms=5.0, device_period_ms=8.0)
    tx.write_tf_gpu_loop(folder / "gpu-not-recorded" / "h.xplane.pb", record_gpu=False)
    tx.write_tf_gpu_loop(
        folder / "copy-under-compute" / "h.xplane.pb",
        host_step_ms=10.0,
        device_period_ms=10.0,
        device_lag_ms=0.5,
        kernels_ms=(6.0, 2.5),
        kernel_gap_ms=0.5,
        overlapped_copy_ms=2.0,
    )
    tx.write_one_step_capture(folder / "one-step-capture" / "h.xplane.pb")
    # The training step is most of the device's work; evaluation a shorter forward pass.
    tx.write_jax_programs(
        folder / "jax-several-programs" / "h.xplane.pb",
        ["jit_init", *(["jit_train_step", "jit_eval_step"] * 4), "jit_log"],
        kernel_ms={"jit_train_step": 3.0, "jit_eval_step": 0.5, "jit_init": 0.2, "jit_log": 0.2},
    )
    # A microbenchmark of several programs where the one that repeats most is not most of the work.
    tx.write_jax_programs(
        folder / "jax-minor-program" / "h.xplane.pb",
        ["jit_matmul", "jit_matmul", "jit_softmax", "jit_add"] * 6,
        kernel_ms={"jit_matmul": 0.3, "jit_softmax": 0.8, "jit_add": 0.2},
    )
    tx.write_keras_cpu_capture(folder / "keras-cpu-one-step" / "h.xplane.pb")
    tx.write_tpu_programs(folder / "tpu-programs-cut" / "h.xplane.pb")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--make", type=Path, default=None, help="write synthetic traces here first and include them")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--no-xprof", action="store_true", help="skip XProf's converter")
    args = parser.parse_args(argv)
    folders = list(args.folders)
    if args.make is not None:
        make_traces(args.make)
        folders.append(args.make)
    rows: list[dict[str, object]] = []
    for folder in folders:
        for path in sorted(folder.rglob("*.xplane.pb")):
            relative = str(path.relative_to(folder))
            name = relative.split("/plugins/")[0] + (
                "/" + path.name.removesuffix(".xplane.pb") if "/plugins/" in relative else ""
            )
            name = name.removesuffix(".xplane.pb")
            print(f"{folder.name}/{name} ...", file=sys.stderr, flush=True)
            try:
                ours = devprof_row(path)
            except Exception as exc:  # noqa: BLE001 - a row that says what failed beats a stopped table
                rows.append({"trace": f"{folder.name}/{name}", "disagree": f"devprof failed: {exc}"})
                continue
            theirs = {} if args.no_xprof else xprof(path)
            summary = xprof_summary(ours, theirs)
            rows.append(
                {
                    "trace": f"{folder.name}/{name}",
                    "found_by": ours["source"],
                    "steps": ours["all_steps"],
                    "used": ours["steps"],
                    "xprof_steps": theirs.get("steps", theirs.get("error", "-")),
                    "own_steps": ours["own"],
                    "step_ms": round(ours["step_ms"], 3),
                    "xprof_step_ms": round(summary["step_ms"], 3) if "step_ms" in summary else None,
                    "device_step_ms": round(ours["device_step_ms"], 3),
                    "device_busy_ms": round(ours["device_busy_ms"], 3),
                    "input_pct": round(ours["input_pct"], 1),
                    "xprof_input_pct": round(summary["input_pct"], 1) if "input_pct" in summary else None,
                    "not_recorded": ours["not_recorded"],
                    "disagree": "; ".join(disagreements(ours, theirs)) or "",
                }
            )
    table = pd.DataFrame(rows)
    if args.markdown:
        print("| " + " | ".join(table.columns) + " |")
        print("|" + "|".join("---" for _ in table.columns) + "|")
        for row in table.itertuples(index=False):
            print("| " + " | ".join("" if v is None or v != v else str(v) for v in row) + " |")
    else:
        with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_colwidth", 60):
            print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
