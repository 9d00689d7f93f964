"""Trace views over hand-made events tables, for tests of single stages."""

from __future__ import annotations

import pandas as pd

from analysis.read.trace import Trace
from analysis.read.view import TraceView


def view_of(events: pd.DataFrame) -> TraceView:
    """A `TraceView` of `events` (with `plane` and `plane_name` columns), its planes derived from them."""
    planes = events[["plane", "plane_name"]].drop_duplicates("plane").astype({"plane_name": str})
    return TraceView(Trace(None, planes.reset_index(drop=True), pd.DataFrame(), events))


def facts_from_mean(values: dict):
    """`make_facts` from a dict named as analyze's JSON and compare's rows name things (a mean step,
    a row): the tests' shorthand for typed arguments. A slowest stage may be given as its text."""
    import inspect
    import math

    from analysis.breakdown.input_stages import SlowestStage
    from analysis.rules.facts import make_facts

    renamed = {"kind": "device", "other_cpu_mean_pct": "other_cpu_pct", "proc_cpu_mean_pct": "proc_cpu_pct"}
    accepted = set(inspect.signature(make_facts).parameters)
    kwargs = {renamed.get(key, key): value for key, value in values.items() if renamed.get(key, key) in accepted}
    kwargs.setdefault("input_pct", None)
    kwargs.setdefault("host_pct", None)
    stage = kwargs.get("slowest_input_stage")
    if isinstance(stage, str):
        kwargs["slowest_input_stage"] = SlowestStage(stage.split(" (")[0], math.nan)
    return make_facts(**kwargs)
