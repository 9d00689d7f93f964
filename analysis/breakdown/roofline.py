"""A roofline per op: each op's FLOPs and bytes per step, what it achieved, and the share of the
ceiling its dtype and arithmetic intensity allow.

Costs come from the cost table (`op_costs.csv` recorded at capture from the traced functions'
graphs, or the HLO shapes a trace carries for XLA programs): one row per op, keyed by the name
the trace gives the op. Ceilings come from a measured peak (`devprof peak`, run.json `peak`, a
peak file) or from the user (`--peak-tflops`); a device's stated peak FLOP/s and memory bandwidth
in the trace stand in for measured ones. A worker that shared its machine's cores with other
workers is held to its share of a CPU ceiling, and a ceiling the ops beat is refused. Nothing is
guessed: an op without a cost row, or a dtype without a ceiling, is left unknown (NaN, "").

The ceiling of an op is its roof at its intensity I (FLOP per byte):
`min(compute ceiling, memory bandwidth x I)`, where the compute ceiling is the dtype's matrix
ceiling for ops that can use matrix units (convolutions, matmuls, dots) and its vector ceiling
for the rest. The op is compute-bound at or right of the ridge point (compute ceiling /
bandwidth), memory-bound left of it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.breakdown import onednn
from analysis.breakdown.ops import OP_COLUMNS, OP_KEYS, op_table
from analysis.read import run_files
from analysis.read.inputs import RunInputs
from analysis.read.run_files import PEAK_FLOPS_LIMIT, RunRecord

ROOFLINE_COLUMNS = [
    "program",
    "dtype",
    "kind",
    "kernel",
    "flops_per_step",
    "bytes_per_step",
    "flops_per_second",
    "bytes_per_second",
    "intensity",
    "bound",
    "ceiling_pct",
]
ANY_DTYPE = "*"
CEILING_KEYS = ("matrix_flops_per_second", "vector_flops_per_second", "memory_bytes_per_second")
# Grappler and oneDNN fuse a matrix op with the bias add and activation after it into one op named
# after the chain's last node; the cost table carries that chain's costs on the last node.
FUSED_TYPE_RE = re.compile(r"Fused")
# oneDNN's kernels run TensorFlow's ops under their own type names: _MklConv2D is Conv2D.
_LIBRARY_PREFIX_RE = re.compile(r"^_(Mkl)?(Native)?")
BELOW_ROOFLINE_PCT = 50.0  # an op under this share of its ceiling runs far below what the device does
BELOW_ROOFLINE_MIN_SHARE = 5.0  # ... and matters when it holds at least this share of op time
BELOW_ROOFLINE_SHOWN = 3
ONEDNN_MIN_SHARE = 0.5  # of an Eigen op's time in oneDNN primitives for oneDNN to be named its kernel


@dataclass(frozen=True)
class Ceilings:
    """Per dtype: matrix and vector FLOP/s and memory bytes/s (NaN: unknown), and where they came from."""

    by_dtype: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str | None = None  # "run.json peak", "peak file", "--peak-tflops", "trace"
    device_name: str = ""
    cores: float = math.nan  # the CPU cores a measured CPU peak ran on (NaN: not a CPU peak, or not recorded)

    def of(self, dtype: str) -> dict[str, float]:
        return self.by_dtype.get(dtype) or self.by_dtype.get(ANY_DTYPE) or {key: math.nan for key in CEILING_KEYS}

    def for_dtypes(self, dtypes: list[str]) -> Ceilings:
        """The ceilings given for every dtype (`ANY_DTYPE`) spelled out for the dtypes the ops run in."""
        if ANY_DTYPE not in self.by_dtype:
            return self
        by_dtype = {d: v for d, v in self.by_dtype.items() if d != ANY_DTYPE}
        for dtype in dtypes:
            by_dtype.setdefault(dtype, dict(self.by_dtype[ANY_DTYPE]))
        return dataclasses.replace(self, by_dtype=by_dtype)

    def known(self) -> bool:
        return any(_finite(v) for values in self.by_dtype.values() for v in values.values())

    def as_dict(self) -> dict:
        return {
            dtype: {key: _or_nan(values.get(key)) for key in CEILING_KEYS} for dtype, values in self.by_dtype.items()
        }


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _or_nan(value) -> float:
    return float(value) if _finite(value) else math.nan


def ceilings_from_peak(peak: dict | None, source: str) -> Ceilings | None:
    """Ceilings from a `devprof peak` result (run.json `peak`, a peak file): its per-dtype `ceilings`,
    else (an older peak) the matrix peaks and the one memory bandwidth, the vector ceiling unknown."""
    if not isinstance(peak, dict) or peak.get("error"):
        return None
    by_dtype: dict[str, dict[str, float]] = {}
    ceilings = peak.get("ceilings")
    if isinstance(ceilings, dict):
        found = peak.get("vector")
        vector: dict = found if isinstance(found, dict) else {}
        for dtype, values in ceilings.items():
            if isinstance(values, dict):
                by_dtype[str(dtype)] = {key: _or_nan(values.get(key)) for key in CEILING_KEYS}
                if search_gave_up(vector.get(dtype)):  # an older peak kept a search that timed its first size only
                    by_dtype[str(dtype)]["vector_flops_per_second"] = math.nan
    else:
        bandwidth = _or_nan(peak.get("memory_bytes_per_second"))
        for dtype, rate in (peak.get("peak_flops_per_second") or {}).items():
            by_dtype[str(dtype)] = {
                "matrix_flops_per_second": _or_nan(rate),
                "vector_flops_per_second": math.nan,
                "memory_bytes_per_second": bandwidth,
            }
    result = Ceilings(by_dtype, source, str(peak.get("device_name") or ""), _peak_cores(peak))
    return result if result.known() else None


def search_gave_up(record) -> bool:
    """Whether a peak's size search stopped for time at its first size: it timed the slowest kernel only,
    which says nothing of the ceiling (unknown, not a number)."""
    sizes = record.get("sizes") if isinstance(record, dict) else None
    return isinstance(record, dict) and record.get("stopped") == "time" and isinstance(sizes, list) and len(sizes) <= 1


def smallest_matrix_rates(peak: dict | None) -> tuple[tuple[str, str, float], ...]:
    """(kind, dtype, FLOP/s) at the smallest size `devprof peak` timed each kind of matrix op (matmul,
    conv) in each dtype: what small ops reach, nearer a model's own layers than the peak's sizes."""
    if not isinstance(peak, dict):
        return ()
    found = []
    for kind in ("conv", "matmul"):
        results = peak.get(kind)
        for dtype, result in results.items() if isinstance(results, dict) else ():
            sizes = result.get("sizes") if isinstance(result, dict) else None
            if not isinstance(sizes, list) or not sizes or not isinstance(sizes[0], dict):
                continue
            smallest = min(
                (s for s in sizes if isinstance(s, dict) and _finite(s.get("size"))),
                key=lambda s: s["size"],
                default=None,
            )
            rate = _or_nan(smallest.get("per_second")) if smallest else math.nan
            if _finite(rate) and rate > 0:
                found.append((kind, str(dtype), float(rate)))
    return tuple(found)


def _peak_cores(peak: dict) -> float:
    """The cores a CPU peak's matmuls ran on: TensorFlow's intra-op threads (0: one per core), at most
    the cores the process could use; NaN for a GPU peak or one that does not say."""
    threads = peak.get("threads")
    if peak.get("device") != "cpu" or not isinstance(threads, dict):
        return math.nan
    cores, intra = _or_nan(threads.get("cores")), _or_nan(threads.get("intra_op"))
    if intra == intra:
        return min(intra, cores) if cores == cores else intra
    return cores


def parse_peak_tflops(text: str) -> dict[str, float]:
    """`--peak-tflops`: one number for every dtype ("1307") or per dtype ("bfloat16=1307,float32=163"),
    in TFLOP/s. A ValueError names what is wrong."""
    out: dict[str, float] = {}
    for part in str(text).split(","):
        part = part.strip()
        dtype, _, value = part.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(
                f"--peak-tflops {text!r}: {value!r} is not a number (give e.g. 1307 or bfloat16=1307,float32=163)"
            ) from None
        if not math.isfinite(number) or number <= 0:
            raise ValueError(f"--peak-tflops {text!r}: a peak must be a positive number of TFLOP/s")
        if number * 1e12 > PEAK_FLOPS_LIMIT:
            raise ValueError(
                f"--peak-tflops {text!r}: {value.strip()} TFLOP/s is above the {PEAK_FLOPS_LIMIT / 1e12:,.0f} TFLOP/s "
                "devprof takes from any device"
            )
        dtype = dtype.strip() or ANY_DTYPE
        if dtype != ANY_DTYPE and not _DTYPE_NAME.match(dtype):
            raise ValueError(f"--peak-tflops {text!r}: {dtype!r} is not a dtype (e.g. float32, bfloat16, float16)")
        if dtype in out:
            raise ValueError(
                f"--peak-tflops {text!r}: "
                + ("one number for every dtype is given twice" if dtype == ANY_DTYPE else f"{dtype} is given twice")
            )
        out[dtype] = number * 1e12
    return out


# float32, bfloat16, float8_e4m3fn, int8, complex64, bool: the names TensorFlow and XLA's converted names use
_DTYPE_NAME = re.compile(r"^(?:b?float\d+(?:_\w+)?|u?int\d+|complex\d+|bool)$")


def ceilings_from_tflops(peaks: dict[str, float]) -> Ceilings:
    """The user's compute peaks (FLOP/s by dtype, `ANY_DTYPE` for every dtype) as matrix ceilings; the
    vector ceiling and the bandwidth unknown."""
    return Ceilings(
        {
            dtype: {
                "matrix_flops_per_second": rate,
                "vector_flops_per_second": math.nan,
                "memory_bytes_per_second": math.nan,
            }
            for dtype, rate in peaks.items()
        },
        "--peak-tflops",
    )


def with_bandwidth(ceilings: Ceilings | None, bandwidth: float, dtypes: list[str], source: str) -> Ceilings | None:
    """`ceilings` with `bandwidth` where their memory ceiling is unknown (a device's stated bandwidth)."""
    if not _finite(bandwidth):
        return ceilings
    base = ceilings.by_dtype if ceilings is not None else {}
    by_dtype, filled = {}, False
    for dtype in sorted({*base, *dtypes}):
        values = dict(base.get(dtype) or {key: math.nan for key in CEILING_KEYS})
        if not _finite(values.get("memory_bytes_per_second")):
            values["memory_bytes_per_second"] = float(bandwidth)
            filled = True
        by_dtype[dtype] = values
    if not filled:  # every memory ceiling was measured: the stated one is not used, nor named
        return ceilings
    names = [s for s in ((ceilings.source if ceilings else None), source) if s]
    return Ceilings(
        by_dtype, " + ".join(names), ceilings.device_name if ceilings else "", ceilings.cores if ceilings else math.nan
    )


def with_stated_peak(ceilings: Ceilings | None, peak_flops: float, dtypes: list[str], source: str) -> Ceilings | None:
    """`ceilings` with `peak_flops` as the matrix ceiling of every dtype the ops run in whose matrix
    ceiling is unknown (a device's stated peak: one number, as `--peak-tflops 1307` is)."""
    if not _finite(peak_flops):
        return ceilings
    base = ceilings.by_dtype if ceilings is not None else {}
    by_dtype, filled = {}, False
    for dtype in sorted({*base, *dtypes}):
        values = dict(base.get(dtype) or {key: math.nan for key in CEILING_KEYS})
        if not _finite(values.get("matrix_flops_per_second")):
            values["matrix_flops_per_second"] = float(peak_flops)
            filled = True
        by_dtype[dtype] = values
    if not filled:
        return ceilings
    names = [s for s in ((ceilings.source if ceilings else None), source) if s]
    return Ceilings(
        by_dtype, " + ".join(names), ceilings.device_name if ceilings else "", ceilings.cores if ceilings else math.nan
    )


def for_worker_cores(ceilings: Ceilings | None, worker_cores: float, machine_cores: float) -> Ceilings | None:
    """A CPU worker that shared its machine with other workers ran its ops on `worker_cores` threads:
    its compute ceilings are the measured ones times its share of the cores they were measured on
    (`ceilings.cores`, else the machine's); memory bandwidth is the machine's, kept as it is."""
    if ceilings is None or not _finite(worker_cores):
        return ceilings
    cores = ceilings.cores if _finite(ceilings.cores) else machine_cores
    if not _finite(cores) or worker_cores >= cores:
        return ceilings
    share = worker_cores / cores
    by_dtype = {
        dtype: {
            key: (value * share if key != "memory_bytes_per_second" and _finite(value) else value)
            for key, value in values.items()
        }
        for dtype, values in ceilings.by_dtype.items()
    }
    source = f"{ceilings.source or 'ceilings'} x {worker_cores:g}/{cores:g} cores (this worker's share)"
    return Ceilings(by_dtype, source, ceilings.device_name, float(worker_cores))


def refuse_beaten(ops: pd.DataFrame, ceilings: Ceilings | None) -> tuple[Ceilings | None, tuple[str, ...]]:
    """`ceilings` without each compute ceiling that the ops of its dtype beat, and one sentence per
    ceiling refused. A device runs no faster than its ceiling, so a ceiling below what the ops achieved
    (FLOPs over their time, all ops of the dtype against the matrix ceiling, its vector ops against the
    vector one) is not this device's (a wrong --peak-tflops, another device's peak, a loaded machine's)."""
    if ceilings is None or ops.empty:
        return ceilings, ()
    known = ops["flops_per_step"].notna() & (ops["ms_per_step"] > 0) & (ops["dtype"] != "")
    by_dtype, said = {d: dict(v) for d, v in ceilings.by_dtype.items()}, []
    for dtype, values in by_dtype.items():
        mine = ops[known & (ops["dtype"] == dtype)]
        for kind, which, rows in (("matrix", "", mine), ("vector", "vector ", mine[mine["kind"] == "vector"])):
            ceiling, achieved = _or_nan(values.get(f"{kind}_flops_per_second")), _rate(rows)
            if ceiling == ceiling and _finite(achieved) and achieved > ceiling:
                values[f"{kind}_flops_per_second"] = math.nan
                said.append(
                    f"the {which}ceiling {ceiling / 1e12:.3g} TFLOP/s for {dtype} is below the achieved "
                    f"{achieved / 1e12:.3g} TFLOP/s: not used"
                )
    if not said:
        return ceilings, ()
    return dataclasses.replace(ceilings, by_dtype=by_dtype), tuple(said)


def _rate(ops: pd.DataFrame) -> float:
    """FLOPs over time of `ops` (per step both); NaN without time."""
    seconds = float(ops["ms_per_step"].sum()) / 1e3
    return float(ops["flops_per_step"].sum()) / seconds if seconds > 0 else math.nan


def _base_type(op_type: str) -> str:
    return _LIBRARY_PREFIX_RE.sub("", str(op_type))


def attach_costs(
    ops: pd.DataFrame, costs: pd.DataFrame | None, device: str, implementations: pd.DataFrame | None = None
) -> pd.DataFrame:
    """`ops` with `ROOFLINE_COLUMNS`: each op's cost row (by name; XLA ops by program and name) times
    its executions per step. Where several traced functions name the same op, the function that holds
    the most of the step's ops is the one that ran. A fused op takes its chain's costs.
    `implementations` (`breakdown.onednn.op_implementations`) name the oneDNN kernel of CPU ops."""
    ops = ops.reset_index(drop=True).copy()
    n = len(ops)
    flops, nbytes = np.full(n, np.nan), np.full(n, np.nan)
    dtype, kind = np.full(n, "", dtype=object), np.full(n, "", dtype=object)
    program = np.full(n, "", dtype=object)
    if costs is not None and not costs.empty and n:
        rows = _chosen_rows(ops, costs)
        at = rows["_op_index"].to_numpy(dtype=np.int64)
        fused = rows["_fused"].to_numpy(dtype=bool)
        flops[at] = np.where(fused, _numbers(rows["chain_flops"]), _numbers(rows["flops"]))
        nbytes[at] = np.where(fused, _numbers(rows["chain_bytes"]), _numbers(rows["bytes"]))
        dtype[at] = rows["dtype"].astype(object).fillna("").astype(str).to_numpy(dtype=object)
        kind[at] = np.where(fused, "matrix", rows["kind"].astype(object).fillna("").astype(str)).astype(object)
        xla = rows["_program"].to_numpy(dtype=float) >= 0
        # "jit_dot(49)", as XLA names its programs: one name often runs as several programs
        program[at[xla]] = [
            f"{name}({int(key)})" for name, key in zip(rows.loc[xla, "function"].astype(str), rows.loc[xla, "_program"])
        ]
    executions = (
        ops["executions_per_step"].to_numpy(dtype=float)
        if "executions_per_step" in ops
        else ops["count_per_step"].to_numpy(dtype=float)
    )
    seconds = ops["ms_per_step"].to_numpy(dtype=float) / 1e3
    per_step_flops, per_step_bytes = flops * executions, nbytes * executions
    ops["program"], ops["dtype"], ops["kind"] = program, dtype, kind
    ops["kernel"] = _kernels(ops, device, implementations)
    ops["flops_per_step"], ops["bytes_per_step"] = per_step_flops, per_step_bytes
    with np.errstate(divide="ignore", invalid="ignore"):
        ops["flops_per_second"] = np.where(seconds > 0, per_step_flops / seconds, np.nan)
        ops["bytes_per_second"] = np.where(seconds > 0, per_step_bytes / seconds, np.nan)
        ops["intensity"] = np.where(per_step_bytes > 0, per_step_flops / per_step_bytes, np.nan)
    ops["bound"] = ""
    ops["ceiling_pct"] = np.nan
    return ops


def _numbers(column: pd.Series) -> np.ndarray:
    """Finite non-negative numbers; anything else NaN (a cost is never made up from a bad cell)."""
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)
    return np.where(np.isfinite(values) & (values >= 0), values, np.nan)


def _kernels(ops: pd.DataFrame, device: str, implementations: pd.DataFrame | None = None) -> np.ndarray:
    """The kernel that ran each op: on a CPU the library (oneDNN's `_Mkl` kernels or TensorFlow's own
    Eigen ones), with oneDNN's implementation of the op's main primitive where its log names it
    ("oneDNN brg_conv_fwd:avx2"); else the device kernel that took most of the op's time."""
    if device == "cpu" or "kernel" not in ops:
        types = ops["type"].astype(str)
        library = np.where(types.str.startswith("_Mkl"), "oneDNN", "Eigen").astype(object)
        if implementations is None or implementations.empty or ops.empty:
            return library
        named = (
            ops[["op", "type", "ms_per_step"]]
            .astype({"op": str, "type": str})
            .merge(implementations, on=["op", "type"], how="left", sort=False)
        )
        implementation = named["implementation"].fillna("").astype(str).to_numpy(dtype=object)
        # An op outside oneDNN's `_Mkl` types (Eigen's, calling oneDNN's gemm) is named by oneDNN only
        # where oneDNN's time is at least half the op's: a stray execution names nothing.
        mostly = named["onednn_ms_per_step"].to_numpy(dtype=float) >= ONEDNN_MIN_SHARE * named["ms_per_step"].to_numpy(
            dtype=float
        )
        use = (implementation != "") & ((library == "oneDNN") | mostly)
        return np.where(use, "oneDNN " + implementation, library).astype(object)
    return ops["kernel"].astype(object).fillna("").astype(str).to_numpy(dtype=object)


def _program_keys(column: pd.Series) -> np.ndarray:
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)
    return np.where(np.isfinite(values), values, -1.0)


def _chosen_rows(ops: pd.DataFrame, costs: pd.DataFrame) -> pd.DataFrame:
    """The cost row of each op that has one (`_op_index` its row in `ops`, `_fused` whether the chain's
    costs apply): by program and name for XLA ops, by name for framework ops; where several functions
    name the op, the one that covers most of the table's op names; none where the trace's type is
    neither the graph's (under a kernel library's name) nor its fused form."""
    costs = costs.copy()
    costs["op"] = costs["op"].astype(str)
    costs["function"] = costs["function"].astype(str) if "function" in costs else ""
    costs["_program"] = _program_keys(costs["program_id"]) if "program_id" in costs else -1.0
    for column in ("type", "dtype", "kind"):
        costs[column] = costs[column].astype(object).fillna("").astype(str) if column in costs else ""
    for column in ("flops", "bytes", "chain_flops", "chain_bytes"):
        if column not in costs:
            costs[column] = np.nan
    names = ops["op"].astype(str)
    inner = names.map(graph_name)
    present = costs[costs["op"].isin(set(names) | set(inner))]
    coverage = present.groupby("function")["op"].nunique()
    costs["_rank"] = -costs["function"].map(coverage).fillna(0).to_numpy(dtype=float)
    wanted = pd.DataFrame(
        {
            "_op_index": np.arange(len(ops)),
            "op": names.to_numpy(),
            "_inlined": False,
            "_trace_type": ops["type"].astype(str).to_numpy(),
            "_op_program": _program_keys(ops["program_id"]) if "program_id" in ops else -1.0,
        }
    )
    # The name the op has in its own function's graph, where the trace's is an inlined one: the exact name first.
    renamed = inner != names
    wanted = pd.concat(
        [wanted, wanted[renamed.to_numpy()].assign(op=inner[renamed].to_numpy(), _inlined=True)], ignore_index=True
    )
    matched = wanted.merge(costs, on="op", how="inner", sort=False)
    # An op of a known program takes that program's row only; one of none, any row of its name.
    matched = matched[(matched["_op_program"] < 0) | (matched["_program"] == matched["_op_program"])]
    pairs = matched[["_trace_type", "type"]].drop_duplicates()
    fits = {(a, b): _type_fits(a, b) for a, b in zip(pairs["_trace_type"], pairs["type"])}
    keep = [a == "XLA" or fits[(a, b)] for a, b in zip(matched["_trace_type"], matched["type"])]
    matched = matched[np.asarray(keep, dtype=bool)] if len(matched) else matched
    matched = matched.sort_values(["_op_index", "_inlined", "_rank"], kind="stable").drop_duplicates("_op_index")
    fused_op = np.asarray(
        [
            bool(FUSED_TYPE_RE.search(a)) and not FUSED_TYPE_RE.search(b)
            for a, b in zip(matched["_trace_type"], matched["type"])
        ],
        dtype=bool,
    )
    chain = pd.to_numeric(matched["chain_flops"], errors="coerce").notna().to_numpy()
    matrix = (matched["kind"] == "matrix").to_numpy()
    # A fused op takes its chain's costs; named after its matrix op, that op's own (the bias and
    # activation after it are a rounding error); named after any other node without a chain, it
    # stays unknown: that node's own cost is not the op's.
    matched = matched.assign(_fused=fused_op & chain)
    return matched[~fused_op | chain | matrix]


# Where TensorFlow inlines a function into its caller, the caller's op name prefixes the function's op
# names ("StatefulPartitionedCall/..."); where it lowers a `while` (an RNN's time loop) or `cond`, the
# body's ops run as "<loop>/body/_14/<the body graph's name>". The cost table has the graphs' names.
_INLINED_RE = re.compile(r"^(?:.*/)?(?:(?:Stateful)?PartitionedCall(?:_\d+)?|(?:body|cond|then|else)/_\d+)/")


def graph_name(trace_name: str) -> str:
    """The op's name in the graph of the innermost function it ran in (the trace's name if none)."""
    match = _INLINED_RE.match(trace_name)
    return trace_name[match.end() :] if match else trace_name


def _type_fits(trace_type: str, graph_type: str) -> bool:
    """The trace ran the graph's op (under a kernel library's name, or fused with what follows it)."""
    trace_base, graph_base = _base_type(trace_type), _base_type(graph_type)
    return bool(graph_base) and trace_base.startswith(graph_base) or bool(FUSED_TYPE_RE.search(trace_base))


def apply_ceilings(ops: pd.DataFrame, ceilings: Ceilings | None) -> pd.DataFrame:
    """`bound` and `ceiling_pct` of every op whose dtype has the ceilings its kind needs."""
    ops = ops.copy()
    if ceilings is None or ops.empty:
        return ops
    compute = np.full(len(ops), np.nan)
    memory = np.full(len(ops), np.nan)
    dtypes, kinds = ops["dtype"].astype(str).to_numpy(), ops["kind"].astype(str).to_numpy()
    for dtype in set(dtypes) - {""}:
        values = ceilings.of(dtype)
        for kind in ("matrix", "vector"):
            here = (dtypes == dtype) & (kinds == kind)
            compute[here] = _or_nan(values.get(f"{kind}_flops_per_second"))
            memory[here] = _or_nan(values.get("memory_bytes_per_second"))
    rate, intensity = ops["flops_per_second"].to_numpy(dtype=float), ops["intensity"].to_numpy(dtype=float)
    known = np.isfinite(compute) & np.isfinite(memory) & np.isfinite(rate) & np.isfinite(intensity)
    with np.errstate(divide="ignore", invalid="ignore"):
        roof = np.minimum(compute, memory * intensity)
        ops["ceiling_pct"] = np.where(known & (roof > 0), 100.0 * rate / roof, np.nan)
        ops["bound"] = np.where(known, np.where(intensity >= compute / memory, "compute", "memory"), "").astype(object)
    return ops


@dataclass(frozen=True)
class BelowRoofline:
    """An op that holds much of the step at a low share of its ceiling."""

    op: str
    type: str
    kind: str
    dtype: str
    bound: str
    kernel: str
    ceiling_pct: float
    ms_per_step: float
    share_pct: float  # of the step's op time
    flops_per_second: float
    program: str = ""  # an XLA op's program (its names repeat across programs)

    @property
    def name(self) -> str:
        return f"{self.program}/{self.op}" if self.program else self.op


def below_roofline(ops: pd.DataFrame) -> tuple[BelowRoofline, ...]:
    """The ops under `BELOW_ROOFLINE_PCT` % of their ceiling that hold at least `BELOW_ROOFLINE_MIN_SHARE` %
    of op time, the most time lost first (time x the share of the ceiling not reached)."""
    if ops.empty or "ceiling_pct" not in ops:
        return ()
    low = ops[(ops["ceiling_pct"] < BELOW_ROOFLINE_PCT) & (ops["compute_pct"] >= BELOW_ROOFLINE_MIN_SHARE)]
    if low.empty:
        return ()
    lost = low["ms_per_step"] * (1 - low["ceiling_pct"] / 100.0)
    low = low.assign(_lost=lost).sort_values("_lost", ascending=False, kind="stable").head(BELOW_ROOFLINE_SHOWN)
    return tuple(
        BelowRoofline(
            str(r.op),
            str(r.type),
            str(r.kind),
            str(r.dtype),
            str(r.bound),
            str(r.kernel),
            float(r.ceiling_pct),
            float(r.ms_per_step),
            float(r.compute_pct),
            float(r.flops_per_second),
            str(getattr(r, "program", "") or ""),
        )
        for r in low.itertuples(index=False)
    )


def summary(
    ops: pd.DataFrame,
    ceilings: Ceilings | None,
    model_flops_per_step: float,
    costs_known: bool,
    refused: tuple[str, ...] = (),
) -> dict | None:
    """The roofline's JSON summary (`roofline`), or None when no op has a known cost and nothing is
    said about it; `refused` says which ceilings `refuse_beaten` took out. The achieved rate is the
    costed ops' FLOPs over those ops' own time: the ops without known costs hold the rest of the
    step, and their FLOPs are not guessed."""
    if ops.empty:
        return None
    known = ops["flops_per_step"].notna()
    op_ms = float(ops["ms_per_step"].sum())
    known_ms = float(ops.loc[known, "ms_per_step"].sum())
    known_pct = 100.0 * known_ms / op_ms if op_ms > 0 else math.nan
    flops = float(ops.loc[known, "flops_per_step"].sum()) if known.any() else math.nan
    out: dict = {
        "ceilings": ceilings.as_dict() if ceilings is not None else {},
        "ceilings_source": ceilings.source if ceilings is not None else None,
        "flops_per_step": flops,
        "bytes_per_step": float(ops.loc[known, "bytes_per_step"].sum()) if known.any() else math.nan,
        "known_time_pct": known_pct,
        "model_flops_per_step": model_flops_per_step,
        "flops_gap_pct": (
            100.0 * (flops - model_flops_per_step) / model_flops_per_step
            if model_flops_per_step > 0 and flops == flops
            else math.nan
        ),
        "dtype": "",
        "achieved_flops_per_second": math.nan,
        "achieved_over": None,
        "mfu_pct": math.nan,
        "notes": list(refused),
    }
    if known.any() and known_ms > 0:
        by_dtype = ops[known & (ops["dtype"] != "")].groupby("dtype")["flops_per_step"].sum()
        dtype = str(by_dtype.idxmax()) if not by_dtype.empty else ""
        achieved = flops / (known_ms / 1e3)
        out["dtype"], out["achieved_flops_per_second"] = dtype, achieved
        out["achieved_over"] = f"over {known_pct:.0f} % of op time that has known costs"
        peak = (
            ceilings.of(dtype).get("matrix_flops_per_second", math.nan) if ceilings is not None and dtype else math.nan
        )
        out["mfu_pct"] = 100.0 * achieved / peak if _finite(peak) else math.nan
    compute = ("matrix_flops_per_second", "vector_flops_per_second")
    given = sorted(
        d
        for d, values in (ceilings.by_dtype.items() if ceilings is not None else ())
        if d != ANY_DTYPE and any(_finite(values.get(k)) for k in compute)
    )
    costed = sorted(set(ops.loc[known & (ops["dtype"] != ""), "dtype"].astype(str)))
    uncovered = [d for d in costed if not any(_finite(ceilings.of(d).get(k)) for k in compute)] if ceilings else []
    if given and uncovered:
        out["notes"].append(
            f"no ceiling for {', '.join(uncovered)}, the dtype of ops with known costs (ceilings are "
            f"given for {', '.join(given)} only): those ops' shares of a ceiling are not given"
        )
    if not costs_known and not known.any():
        out["notes"].append(
            "no op costs: the run has no op_costs.csv and the trace carries no HLO shapes, so FLOPs "
            "and bytes per op are unknown (not guessed)"
        )
    elif not refused and (
        ceilings is None
        or not any(_finite(values.get("matrix_flops_per_second")) for values in ceilings.by_dtype.values())
    ):
        stated = (
            " (the memory ceiling is the device's stated bandwidth)"
            if ceilings is not None and ceilings.known()
            else ""
        )
        out["notes"].append(
            f"compute ceilings unknown: no measured peak for this device{stated}, so no op's share "
            "of its ceiling is given; measure one (devprof peak, then devprof run --measure-peak) or "
            "give it (devprof analyze --peak-file FILE or --peak-tflops TFLOPS)"
        )
    return out


# ---------------------------------------------------------------- one worker's ops on its ceilings


def ops_on_the_roofline(
    inputs: RunInputs, used: pd.DataFrame, device: str, peak: Ceilings | None
) -> tuple[pd.DataFrame, dict | None]:
    """The op table of the `used` steps with each op's costs and share of its ceiling, and the
    roofline summary. The ceilings: `peak` (the user's), else the run's measured peak, a CPU one
    scaled to this worker's share of the cores; a peak and a bandwidth the trace states fill in what
    neither gives; a compute ceiling the ops beat is refused, with a warning."""
    view = inputs.trace
    ops = op_table(view, used, device) if view is not None else pd.DataFrame(columns=OP_COLUMNS + OP_KEYS)
    implementations = (
        onednn.op_implementations(view, used, inputs.onednn)
        if view is not None and device == "cpu" and inputs.onednn is not None
        else None
    )
    ops = attach_costs(ops, inputs.op_costs, device, implementations)
    dtypes = sorted(set(ops["dtype"]) - {""})
    run = inputs.run
    ceilings = peak if peak is not None else ceilings_from_peak(run.peak if run is not None else None, "run.json peak")
    ceilings = ceilings.for_dtypes(dtypes) if ceilings is not None else None
    if device == "cpu" and run is not None:
        ceilings = for_worker_cores(ceilings, *_worker_cores(run))
    ceilings = with_stated_peak(ceilings, inputs.stated_peak_flops, dtypes, "trace (stated peak)")
    ceilings = with_bandwidth(ceilings, inputs.stated_bandwidth, dtypes, "trace (stated bandwidth)")
    ceilings, refused = refuse_beaten(ops, ceilings)
    for sentence in refused:
        run_files.warn(f"roofline: {sentence}")
    ops = apply_ceilings(ops, ceilings)
    return ops, summary(
        ops, ceilings, _model_flops_per_step(run), inputs.op_costs is not None and not inputs.op_costs.empty, refused
    )


def _worker_cores(run: RunRecord) -> tuple[float, float]:
    """(the intra-op threads of a worker that shared its machine with other workers, the machine's
    cores); NaN where the worker had the machine to itself or run.json does not say."""
    device = run.device
    local, threads, cores = device.get("local_workers"), device.get("intra_op_threads"), device.get("cores")
    number = (int, float)
    if not isinstance(local, number) or local <= 1 or not isinstance(threads, number) or threads <= 0:
        return math.nan, math.nan
    return float(threads), float(cores) if isinstance(cores, number) and cores > 0 else math.nan


def measured_matrix_ceilings(inputs: RunInputs, peak: Ceilings | None) -> tuple[dict[str, float], str | None, tuple]:
    """The matrix FLOP/s measured (or given) per dtype, their source, and what the smallest matrix ops
    `devprof peak` timed reached per dtype: what precision advice compares. A ceiling given for every
    dtype at once, or stated by the trace, says nothing of one dtype against another."""
    run = inputs.run
    ceilings = peak if peak is not None else ceilings_from_peak(run.peak if run is not None else None, "run.json peak")
    if ceilings is None:
        return {}, None, ()
    rates = {
        dtype: values.get("matrix_flops_per_second", math.nan)
        for dtype, values in ceilings.by_dtype.items()
        if dtype != ANY_DTYPE
    }
    small = smallest_matrix_rates(run.peak) if peak is None and run is not None else ()
    return rates, ceilings.source, small


def _model_flops_per_step(run: RunRecord | None) -> float:
    """The model's training FLOPs per step from run.json (FLOPs per image x this worker's batch); NaN unknown."""
    if run is None:
        return math.nan
    per_image = run.model.get("train_flops_per_image")
    batch = run.raw.get("per_worker_batch_size") or run.config.get("batch_size")
    if not isinstance(per_image, (int, float)) or not isinstance(batch, (int, float)) or per_image <= 0 or batch <= 0:
        return math.nan
    return float(per_image) * float(batch)
