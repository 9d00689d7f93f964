"""Find the training steps of any trace and say how: the methods in order, program executions, the window.

In order, the first method that finds steps wins (two at least, but for the trace's own
one-step records: a device `Steps` line, Keras' train_function):

1. `markers`: step markers (`Trace("train", step_num=N, _r=1)`, Keras' "Profiled batch").
2. `trace_groups`: step grouping stored in the trace: `group_id` stats on host events,
   or a `Steps` line on a device plane (TPUs carry one natively).
3. `program_executions`: repeated executions of the training program: the most frequent
   Python-level `tf.function` call on one thread (never a tf.data function; one call of
   Keras' `train_function` is enough), else the most frequent XLA/PjRt program execution on
   the host (known by what its launch carries, or the module it runs), else the most frequent
   program on the devices' `XLA Modules` lines (on TPUs these come before the host's
   launches). Executions run on several threads or devices at once: the k-th execution on
   each forms step k. Only a program holding PROGRAM_SHARE_MIN of the devices' busy time is
   the step; otherwise the window is, with a note on every program's share.
4. `window`: nothing repeats; the whole traced window is one step.

Every method gives the same two frames. `steps`: one row per step with `step`, `steps`
(training steps per call), `name`, `plane`, `line` (the thread that ran it),
`start_ns`, `marker_end_ns` (where its own events end) and `end_ns` (the next step's
start when that comes later, else its own end: the gap to the next execution, iterator
wait and Python, belongs to the step). `spans`: each thread's part of each step
(`step`, `plane`, `line`, `start_ns`, `marker_end_ns`), which host compute is read from.
The frames, step markers and the trace's own step groups are in `recorded.py`.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis import producers
from analysis.producers import keras as keras_producer
from analysis.producers import tensorflow as tf_producer
from analysis.producers import tpu as tpu_producer
from analysis.read.trace import TraceError
from analysis.read.view import TraceView, intervals, matches, present
from analysis.steps.recorded import SPAN_COLUMNS, DetectedSteps, _cut_by_window, _frame, find_markers, find_trace_groups

METHODS = ("markers", "trace_groups", "program_executions", "window")


def detect_steps(view: TraceView, step_name: str | None = None) -> DetectedSteps:
    """The steps of a trace by the first method that finds some; `step_name` (a regex) picks
    among markers and program executions by name."""
    wanted = re.compile(step_name) if step_name else None
    finders = [lambda: find_markers(view, wanted), lambda: find_program_executions(view, wanted)]
    if wanted is None:  # a name picks among markers and programs; the trace's own groups have none
        finders.insert(1, lambda: find_trace_groups(view))
    for finder in finders:
        found = finder()
        if found is not None:
            if wanted is not None and found.method != "markers":
                markers = find_markers(view, None)
                if markers is not None:  # say what the trace's own steps are, beside what the pattern matched
                    found.note = (
                        f"--step-name {step_name!r} matches none of the trace's step markers "
                        f"({markers.name!r}): {found.note.removeprefix('no step markers: ')}"
                    )
            return found
    if wanted is not None:
        raise TraceError(
            f"--step-name {step_name!r} matches no step marker and no repeated program execution; "
            f"candidates: {', '.join(candidate_names(view)[:8]) or 'none'}"
        )
    return whole_window(view)


def candidate_names(view: TraceView) -> list[str]:
    """Names `--step-name` can pick: markers, tf.function calls and program executions, most frequent first."""
    host = view.host
    picked = host[
        present(host["step_num"])
        | present(host["tf_function_call"])
        | matches(host["name"], producers.pattern("program"), search=True)
    ]
    return [str(name) for name in picked["name"].astype(str).value_counts().index]


# ---------------------------------------------------------------- 3. program executions


# Executions of one program are the steps only when that program is most of the devices' work:
# at least this share of their busy time. Below it (a microbenchmark of many programs, an eval
# program run as often as the training one) the steps' means would leave much of the device's
# work outside every step, so the window is one step.
PROGRAM_SHARE_MIN = 0.75


def find_program_executions(view: TraceView, wanted: re.Pattern | None = None) -> DetectedSteps | None:
    """On TPUs the device's own record of its programs (`XLA Modules`: every execution, on the device's
    clock) comes before the host's launches, which say less (a launch may carry no program at all, or
    be recorded on a clock of its own); a GPU's `XLA Modules` line is derived from those launches."""
    on_device = view.on_device
    tpu = (on_device["line_name"] == tpu_producer.PROGRAM_LINE).any() and matches(
        on_device["plane_name"], tpu_producer.PLANE, search=True
    ).any()
    finders = (
        (_function_calls, _device_programs, _host_programs)
        if tpu
        else (_function_calls, _host_programs, _device_programs)
    )
    for finder in finders:
        found = finder(view, wanted)
        if found is not None:
            return found if wanted is not None else _the_program_that_is_the_work(view, found, finder)
    return None


def _the_program_that_is_the_work(view: TraceView, found: DetectedSteps, finder) -> DetectedSteps:
    """`found` when its program holds PROGRAM_SHARE_MIN of the devices' busy time (or that cannot be
    told); else the repeated program that does (as often run as an evaluation program, say); else
    the window, whose note lists the programs with their executions and share of device time."""
    shares = program_shares(view, found.candidates)
    if shares is None or found.name not in shares.index or shares.at[found.name, "share"] >= PROGRAM_SHARE_MIN:
        return found
    top = shares.iloc[0]
    if top["share"] >= PROGRAM_SHARE_MIN and top["executions"] >= 2:
        work = finder(view, re.compile(f"^{re.escape(str(shares.index[0]))}$"))
        if work is not None:
            return work
    listed = "; ".join(
        f"{name} {int(row.executions)} execution{'s' if row.executions != 1 else ''}, {100 * row.share:.1f} %"
        for name, row in shares.head(8).iterrows()
    )
    more = f"; {len(shares) - 8} more" if len(shares) > 8 else ""
    window = whole_window(view)
    window.note = (
        f"{found.name} repeats most but holds only {100 * shares.at[found.name, 'share']:.1f} % of the "
        f"devices' busy time (its executions are the steps from {100 * PROGRAM_SHARE_MIN:.0f} %): the "
        f"whole traced window is analysed as one step. Programs (executions, share of device busy "
        f"time): {listed}{more}"
    )
    return window


def program_shares(view: TraceView, candidates: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per program (`key` of `candidates`, its executions): `executions` and `share` of the devices'
    busy time (summed over devices), most first; None when no device work can be given to a program.

    A device event belongs to the program whose execution launched it (its `correlation_id`'s host
    call inside the execution, on the same thread), or whose `XLA Modules` event on the device holds it."""
    device = view.device
    if candidates is None or candidates.empty or device.empty:
        return None
    owner = pd.Series(None, index=device.index, dtype=object)
    if "correlation_id" in device and device["correlation_id"].notna().any():
        calls = view.host[view.host["correlation_id"].notna()]
        launched = calls.groupby(calls["correlation_id"].astype(str)).first()[["plane", "line", "start_ns"]]
        at = launched.reindex(device["correlation_id"].astype(str).to_numpy()).set_axis(device.index)
        threads = {"plane": "int64", "line": "int64"}
        runs = (
            candidates[["plane", "line", "start_ns", "end_ns", "key"]]
            .astype(threads)
            .rename(columns={"start_ns": "run_ns"})
            .sort_values("run_ns", kind="stable")
        )
        # The execution on the launch's own thread; else (the runtime records its API calls on a line
        # of their own) the execution running when the launch was made.
        for by in (["plane", "line"], None):
            known = at[at["start_ns"].notna() & owner.isna()]
            if known.empty:
                break
            found = pd.merge_asof(
                known.astype({**threads, "start_ns": "int64"}).reset_index().sort_values("start_ns", kind="stable"),
                runs if by else runs.drop(columns=["plane", "line"]),
                left_on="start_ns",
                right_on="run_ns",
                by=by,
                direction="backward",
            )
            inside = found["run_ns"].notna() & (found["start_ns"] < found["end_ns"])
            owner.loc[found.loc[inside, "index"].to_numpy()] = found.loc[inside, "key"].to_numpy()
    on_modules = (
        candidates[candidates["line_name"] == tpu_producer.PROGRAM_LINE]
        if "line_name" in candidates
        else candidates.iloc[0:0]
    )
    for plane, modules in on_modules.groupby("plane"):
        mine = (device["plane"] == plane).to_numpy() & owner.isna().to_numpy()
        spans = modules.sort_values("start_ns", kind="stable")
        starts = spans["start_ns"].to_numpy(dtype=np.int64)
        at = device["start_ns"].to_numpy(dtype=np.int64)[mine]
        index = np.searchsorted(starts, at, side="right") - 1
        valid = (index >= 0) & (at < spans["end_ns"].to_numpy(dtype=np.int64)[np.clip(index, 0, None)])
        keys = np.where(valid, spans["key"].to_numpy()[np.clip(index, 0, None)], None)
        owner.loc[device.index[mine]] = keys
    if owner.isna().all():
        return None

    def busy(events: pd.DataFrame) -> int:
        return int(sum(iv.total(intervals(group)) for _, group in events.groupby("plane")))

    total = busy(device)
    owned = device.assign(owner=owner.to_numpy())
    rows = {str(key): busy(events) for key, events in owned[owned["owner"].notna()].groupby("owner")}
    counts = candidates.groupby(["key", "plane", "line"]).size().groupby(level=0).max()
    shares = pd.DataFrame(
        {
            "executions": counts.reindex(list(rows)).fillna(0).astype(int),
            "share": pd.Series(rows, dtype=float) / total if total else 0.0,
        }
    )
    return shares.sort_values("share", ascending=False, kind="stable")


def _kth_on_each_thread(
    executions: pd.DataFrame, name: str, method_note: str, *, rounds: int = 2, view: TraceView | None = None
) -> DetectedSteps | None:
    """Step k = the k-th execution on every thread (or device) that runs the program; at least
    `rounds` of them. With `view`, an execution cut by the traced window's edge makes its round partial."""
    executions = executions.sort_values("start_ns", kind="stable").copy()
    executions["step"] = executions.groupby(["plane", "line"], sort=False).cumcount()
    if executions.empty or executions["step"].max() < rounds - 1:
        return None
    per_step = executions.groupby("step").agg(start_ns=("start_ns", "min"), marker_end_ns=("end_ns", "max"))
    first = executions.sort_values("start_ns", kind="stable").drop_duplicates("step").set_index("step")
    first = first.loc[per_step.index]
    thread = executions["plane"].astype("int64") * 1_000_003 + executions["line"].astype("int64")
    threads_per_step = thread.groupby(executions["step"]).nunique()
    partial = (
        (threads_per_step.loc[per_step.index] < thread.nunique()).to_numpy().copy()
    )  # a round some thread did not run
    if view is not None and len(executions) > 1:
        cut = pd.Series(_cut_executions(view, executions), index=executions.index).groupby(executions["step"]).any()
        partial |= cut.loc[per_step.index].to_numpy()
    steps = _frame(
        per_step.index.to_numpy(),
        1,
        name,
        first["plane"],
        first["line"],
        per_step["start_ns"],
        per_step["marker_end_ns"],
        partition=True,
        partial=partial,
    )
    spans = executions.rename(columns={"end_ns": "marker_end_ns"})[SPAN_COLUMNS].reset_index(drop=True)
    threads = executions[["plane", "line"]].drop_duplicates()
    note = (
        f"no step markers: each step is one execution of {name} ({method_note}"
        + (f", on {len(threads)} threads or devices at once" if len(threads) > 1 else "")
        + ")"
    )
    return DetectedSteps("program_executions", name, steps, spans, note)


def _cut_executions(view: TraceView, executions: pd.DataFrame) -> np.ndarray:
    """Executions of one program that the traced window cut: they touch its first or last nanosecond
    and are shorter than the program's usual execution (a program runs in about the same time each
    time; the last event of a trace touches its end without being cut)."""
    starts, ends = executions["start_ns"].to_numpy(), executions["end_ns"].to_numpy()
    touches = _cut_by_window(view, starts, ends)
    usual = float(np.median(ends - starts))
    return touches & ((ends - starts) < 0.95 * usual)


def _most_frequent(executions: pd.DataFrame, key: str) -> str | None:
    """The name executed most often on one thread (ties: the longest in total)."""
    if executions.empty:
        return None
    per_thread = (
        executions.groupby([key, "plane", "line"], observed=True)
        .agg(count=("start_ns", "size"), total=("duration_ns", "sum"))
        .reset_index()
    )
    per_thread = per_thread.sort_values(["count", "total"], ascending=False, kind="stable")
    best = per_thread.iloc[0]
    return str(best[key]) if best["count"] >= 2 else None


def _function_calls(view: TraceView, wanted: re.Pattern | None) -> DetectedSteps | None:
    """Python-level tf.function calls (events with a `tf_function_call` stat) off tf.data threads."""
    host = view.host
    calls = host[host[tf_producer.FUNCTION_CALL_STAT].notna()]
    input_pipeline = re.compile(tf_producer.INPUT_PIPELINE_FUNCTION, re.IGNORECASE)
    calls = calls[
        ~(
            matches(calls["name"], input_pipeline, search=True)
            | matches(calls["line_name"], input_pipeline, search=True)
        )
    ]
    calls = calls.assign(concrete=_concrete_functions(host, calls))
    if wanted is not None:
        concrete_named = np.fromiter(
            (bool(n) and bool(wanted.search(n)) for n in calls["concrete"]), dtype=bool, count=len(calls)
        )
        calls = calls[matches(calls["name"], wanted, search=True).to_numpy() | concrete_named]
    calls = calls.assign(key=calls["name"].astype(str))
    name = _most_frequent(calls, "key")
    if name is None:  # one call: a step only when it is Keras' training function, Keras' own step
        keras = calls[matches(calls["key"], keras_producer.TRAIN_FUNCTION, search=True)]
        name = str(keras["key"].iloc[0]) if len(keras) == 1 else None
    if name is None:
        return None
    chosen = calls[calls["key"] == name]
    top = chosen.groupby(["plane", "line"]).size().idxmax()
    chosen = chosen[(chosen["plane"] == top[0]) & (chosen["line"] == top[1])]
    concrete = next((c for c in chosen["concrete"] if c), "")
    found = _kth_on_each_thread(
        chosen,
        concrete or name,
        f"tf.function '{name}' called from the training thread",
        rounds=1 if len(chosen) == 1 else 2,
    )
    if found is not None:
        found.candidates = calls.assign(key=calls["key"].where(calls["key"] != name, found.name))
    return found


def _concrete_functions(host: pd.DataFrame, calls: pd.DataFrame) -> pd.Series:
    """`__inference_...` named by the first event inside each call on its thread ('' if none)."""
    concrete = re.compile(tf_producer.CONCRETE_FUNCTION)
    named = host[matches(host["name"], concrete, search=True)][["plane", "line", "start_ns", "name"]]
    if named.empty or calls.empty:
        return pd.Series("", index=calls.index)
    found = pd.merge_asof(
        calls[["plane", "line", "start_ns", "end_ns"]].reset_index().sort_values("start_ns", kind="stable"),
        named.rename(columns={"start_ns": "named_ns"}).sort_values("named_ns", kind="stable"),
        left_on="start_ns",
        right_on="named_ns",
        by=["plane", "line"],
        direction="forward",
    )
    inside = found["named_ns"].notna() & (found["named_ns"] < found["end_ns"])

    def function_of(name) -> str:
        match = concrete.search(name) if isinstance(name, str) else None
        return match.group(1) if match else ""

    names = found["name"].where(inside).astype(object).map(function_of)
    return pd.Series(names.to_numpy(), index=found["index"].to_numpy()).reindex(calls.index).fillna("")


TF_OP_NAME = re.compile(r"^[^:]+:_?[A-Z][A-Za-z0-9]*$")  # "scope/conv2d/Relu:_MklNativeFusedConv2D"


def _host_programs(view: TraceView, wanted: re.Pattern | None) -> DetectedSteps | None:
    """XLA/PjRt program executions on host threads (`...Executable::Execute` on py_xla_execute threads),
    one program by its identity: the module it ran (`module_name` inside the call), not the generic
    launch name that every program's execution shares."""
    host = view.host
    executions = host[matches(host["name"], producers.pattern("program"))]
    executions = executions.assign(key=_program_names(host, executions))
    if wanted is not None:  # asked for by name, any repeated host event (or program) can stand for a step
        named = host[matches(host["name"], wanted, search=True)]
        executions = pd.concat(
            [executions[matches(executions["key"], wanted, search=True)], named.assign(key=named["name"].astype(str))]
        )
        executions = executions[~executions.index.duplicated()]
    name = _most_frequent(executions, "key")
    if name is None:
        return None
    is_program = matches(executions.loc[executions["key"] == name, "name"], producers.pattern("program")).any()
    if wanted is not None and not is_program and TF_OP_NAME.search(name):
        # One execution of one op is no step: every other op of the step would read as host overhead.
        raise TraceError(
            f"--step-name {wanted.pattern!r} matches a TensorFlow op ({name}), not a step; a step is a "
            f"step marker, a tf.function call or a program: {', '.join(candidate_names(view)[:8]) or 'none'}"
        )
    what = (
        "an XLA program run from the host"
        if is_program
        else "a host event matching --step-name, not a program or step marker"
    )
    found = _kth_on_each_thread(executions[executions["key"] == name], name, what, view=view)
    if found is not None:
        found.candidates = executions
    return found


def _program_names(host: pd.DataFrame, executions: pd.DataFrame) -> pd.Series:
    """Each execution's program: the `module_name` of the first event inside it on its thread that
    names one (the execution's own included), else the `program_id` it carries, else its own name."""
    own = executions["name"].astype(str)
    if "program_id" in executions and executions["program_id"].notna().any():
        # The launch names its program by id (TFRT on TPUs): by name where a host event carries both.
        ids = executions["program_id"]
        named = _module_names_by_id(host, ids)
        by_id = ids.map(lambda i: named.get(int(i), f"program({int(i)})") if pd.notna(i) else None)
        own = by_id.where(by_id.notna(), own).astype(str)
    if "module_name" not in host or executions.empty:
        return own
    named = host.loc[host["module_name"].notna(), ["plane", "line", "start_ns", "module_name"]]
    if named.empty:
        return own
    found = pd.merge_asof(
        executions[["plane", "line", "start_ns", "end_ns"]]
        .reset_index()
        .astype({"plane": "int64", "line": "int64"})
        .sort_values("start_ns", kind="stable"),
        named.rename(columns={"start_ns": "named_ns"})
        .astype({"plane": "int64", "line": "int64"})
        .sort_values("named_ns", kind="stable"),
        left_on="start_ns",
        right_on="named_ns",
        by=["plane", "line"],
        direction="forward",
    )
    inside = found["named_ns"].notna() & (found["named_ns"] < found["end_ns"])
    modules = pd.Series(found["module_name"].where(inside).to_numpy(), index=found["index"].to_numpy())
    return modules.reindex(executions.index).astype(object).where(lambda m: m.notna(), own)


def _module_names_by_id(host: pd.DataFrame, ids: pd.Series) -> dict[int, str]:
    """Program ids named by the host's own `module_name` stats on events with that id ({} if none)."""
    if "module_name" not in host:
        return {}
    named = host[host["module_name"].notna() & host["program_id"].notna() & host["program_id"].isin(ids.dropna())]
    return {int(i): str(m) for i, m in zip(named["program_id"], named["module_name"])}


def _device_programs(view: TraceView, wanted: re.Pattern | None) -> DetectedSteps | None:
    """Programs on the devices' `XLA Modules` lines (TPU planes)."""
    modules = view.on_device[lambda e: e["line_name"] == tpu_producer.PROGRAM_LINE]
    if wanted is not None:
        modules = modules[matches(modules["name"], wanted, search=True)]
    modules = modules.assign(key=modules["name"].astype(str))
    name = _most_frequent(modules, "key")
    if name is None:
        return None
    found = _kth_on_each_thread(
        modules[modules["key"] == name], name, "a program on the devices' XLA Modules line", view=view
    )
    if found is not None:
        found.spans = found.spans.iloc[0:0]  # device lines: no host thread ran it
        found.candidates = modules
    return found


# ---------------------------------------------------------------- 4. the whole window


def whole_window(view: TraceView) -> DetectedSteps:
    active = pd.concat([view.host, view.device])
    if active.empty:
        active = view.events
    start, end = int(active["start_ns"].min()), int(active["end_ns"].max())
    busiest = view.host["line"].value_counts()
    line = int(busiest.index[0]) if len(busiest) else 0
    plane = int(view.host["plane"].iloc[0]) if len(busiest) else 0
    steps = _frame([0], 1, "the traced window", [plane], [line], [start], [end])
    return DetectedSteps(
        "window",
        "the traced window",
        steps,
        steps[SPAN_COLUMNS].iloc[0:0].copy(),
        "nothing repeats in this trace (no step markers, step groups or repeated program "
        "executions): the whole traced window is analysed as one step",
    )
