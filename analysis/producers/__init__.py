"""What each producer of trace events writes, one module per producer.

A producer module (`tensorflow`, `keras`, `xla`, `cuda`, `rocm`, `tpu`) declares a
`PRODUCER`: regular expressions for the event names it writes, by what they mean
(the loop waiting for input, an input copy to a device, another copy, a collective, a
kernel launch on the host, compilation, a program execution that can stand for a step).
The breakdown asks this package for a meaning (`pattern("device_copy")`), never for a
producer's names, so supporting a new producer is one new module listed in `MODULES`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

MEANINGS = (
    "host_input",  # host events: the training loop blocked waiting for its batch
    "device_input",  # device events: host-to-device input copies (and infeed)
    "device_copy",  # device events: other copies (device-to-device, device-to-host, copy kernels)
    "collective",  # device events: collectives (all-reduce, all-gather, ...)
    "launch",  # host events: the API call that launches device work
    "compile",  # host events: tracing and compilation
    "host_execution",  # host events: executing a program's ops (CPU compute)
    "eager_wrapper",  # host events whose own time is dispatch, not compute
    "program",  # host events: one execution of a compiled program (a step candidate)
    "device_program",  # device events: one program on a device (TPU `XLA Modules`)
    "device_to_host",  # device events: copies of results back to the host
    "host_sync",  # host events: ops that wait for the device's output (printing a tensor)
)


@dataclass(frozen=True)
class Producer:
    name: str
    host_input: str | None = None
    device_input: str | None = None
    device_copy: str | None = None
    collective: str | None = None
    launch: str | None = None
    compile: str | None = None
    host_execution: str | None = None
    eager_wrapper: str | None = None
    program: str | None = None
    device_program: str | None = None
    device_to_host: str | None = None
    host_sync: str | None = None
    step_markers: tuple[str, ...] = ()


MODULES = ("tensorflow", "keras", "xla", "cuda", "rocm", "tpu")


@functools.cache
def producers() -> tuple[Producer, ...]:
    import importlib

    return tuple(importlib.import_module(f"analysis.producers.{name}").PRODUCER for name in MODULES)


def matches(names: pd.Series, pattern: re.Pattern, *, search: bool = False) -> pd.Series:
    """Whether each name matches `pattern` (`re.match`; `re.search` with `search=True`).

    The pattern (with its flags) is tried once per distinct name, not once per row:
    the trace's name columns are categorical, and a trace repeats a few hundred names
    over hundreds of thousands of events.
    """
    names = names if isinstance(names.dtype, pd.CategoricalDtype) else names.astype("category")
    test = pattern.search if search else pattern.match
    categories = names.cat.categories
    hit = np.fromiter((test(name) is not None for name in categories), dtype=bool, count=len(categories))
    codes = names.cat.codes.to_numpy()
    return pd.Series(hit[codes] & (codes >= 0), index=names.index)


@functools.cache
def pattern(meaning: str) -> re.Pattern:
    """One case-insensitive pattern for a meaning, across all producers (matches nothing if none has it)."""
    if meaning not in MEANINGS:
        raise KeyError(f"unknown meaning {meaning!r}; one of {', '.join(MEANINGS)}")
    parts = [getattr(p, meaning) for p in producers() if getattr(p, meaning)]
    return re.compile("|".join(f"(?:{part})" for part in parts) or r"(?!)", re.IGNORECASE)


# Known step markers, most trusted first: TensorFlow's `Trace("train", step_num=N)` (also
# devprof's own loop), then the Keras TensorBoard callback's.
MARKER_PRECEDENCE = ("tensorflow", "keras")


def step_markers() -> tuple[str, ...]:
    by_name = {p.name: p for p in producers()}
    return tuple(name for producer in MARKER_PRECEDENCE for name in by_name[producer].step_markers)


def marker_rank(name: str, is_root: bool, count: int) -> tuple:
    """Sort key of a step marker name, lowest first: XProf root markers (`_r=1`) first, then known
    markers in `MARKER_PRECEDENCE` (a name that extends a known one, "train_step", ranks with it, after
    the exact name), then unknown names by how often they occur."""
    known = step_markers()
    position = next((i for i, marker in enumerate(known) if name == marker or name.startswith(marker)), len(known))
    return (not is_root, position, name not in known, -count)


PROGRAMS = ("devprof", "keras", "tensorflow", "jax", "unknown")
# Keras' fit runs these tf.functions (Keras 2: train_function; Keras 3: one/multi_step_on_iterator).
KERAS_FUNCTION = re.compile(r"train_function|(?:one|multi)_step_on_(?:iterator|data)")


def program_of(host) -> str:
    """Which kind of program wrote a trace, from its host events: `keras` (fit), `tensorflow` (a
    custom loop), `jax` (XLA programs run by PjRt with no TensorFlow on the host) or `unknown`.
    devprof's own runs are told by their run directory, not by the trace."""
    if host.empty:
        return "unknown"
    names = host["name"]
    if names.isin(step_markers()[1:]).any() or matches(names, KERAS_FUNCTION, search=True).any():
        return "keras"
    tensorflow = (
        host["tf_function_call"].notna().any()
        or matches(names, pattern("host_input")).any()
        or matches(names, pattern("eager_wrapper")).any()
    )
    if tensorflow:
        return "tensorflow"
    if matches(names, pattern("program")).any():
        return "jax"
    return "unknown"


assert {f.name for f in fields(Producer)} >= set(MEANINGS)
