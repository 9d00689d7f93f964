"""`devprof mcp`: devprof's analysis as tools for agents, over stdio with the official MCP SDK.

Tools: `list_runs`, `analyze` (the summary, `devprof.summary/1`), `findings`, `ops`, `steps`,
`compare`, `explain_rule`. Each reads runs under the roots the server was started with, and
nothing else: a path is resolved with its links followed and refused, with the reason, when it
names `..`, when it leads outside every root, or when a link inside the folder does (the analysis
would follow it). Read-only: the analysis is called without writing its output files, and an
analysis is kept (the last few, while their files are unchanged) so that asking for its
findings, ops and steps after the summary costs no second analysis.

The tools are plain functions of a `Tools` object, so they run without the SDK too; the SDK is
imported by `build_server` only, so `devprof --help` never pays for it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import warnings
from collections import OrderedDict
from pathlib import Path

try:  # the SDK's own validation would turn `true` and "5" into numbers: a strict int refuses them
    from pydantic import StrictInt
except ImportError:  # no SDK (nor its pydantic): the server cannot start, and says so
    StrictInt = int  # type: ignore[misc]

CACHED_ANALYSES = 4
MAX_SCANNED_ENTRIES = 20_000  # a run, job or log folder holds far fewer files
LIST_DEPTH = 6  # list_runs looks this many folders deep under a root
MAX_LIST = 500
MAX_OPS = 500
MAX_STEPS = 1000
TRACE_SUFFIX = ".xplane.pb"


class Refused(ValueError):
    """A path the server does not read, and why."""


class Roots:
    """The folders the server may read, resolved once; `resolve` turns a tool's path into one of them."""

    def __init__(self, folders):
        resolved = []
        for folder in folders:
            path = Path(folder).expanduser()
            try:
                path = path.resolve(strict=True)
            except (OSError, RuntimeError):
                raise ValueError(f"--root {folder}: no such folder") from None
            if not path.is_dir():
                raise ValueError(f"--root {folder}: not a folder")
            resolved.append(path)
        if not resolved:
            raise ValueError("no root folder given")
        self.folders = tuple(dict.fromkeys(resolved))

    def within(self, path: Path) -> bool:
        return any(path == root or path.is_relative_to(root) for root in self.folders)

    def resolve(self, path) -> Path:
        """`path` (absolute, or relative to the first root where it exists), its links followed;
        `Refused` when it names `..`, does not exist, or leads outside every root."""
        if not isinstance(path, str) or not path.strip():
            raise Refused("a path is needed: a run directory, log folder or .xplane.pb file under a root")
        if "\0" in path:
            raise Refused("a path with a NUL character is refused")
        given = Path(path).expanduser()
        if ".." in given.parts:
            raise Refused(
                f"{path}: paths with '..' are refused; name the run by its path under a root ({self.shown()})"
            )
        candidates = [given] if given.is_absolute() else [root / given for root in self.folders]
        for candidate in candidates:
            if not os.path.lexists(candidate):
                continue
            try:
                resolved = candidate.resolve(strict=True)
            except (OSError, RuntimeError):
                raise Refused(f"{path}: a broken link or a loop of links") from None
            if not self.within(resolved):
                where = f"a link to {resolved}, " if resolved != candidate.absolute() else ""
                raise Refused(f"{path}: {where}outside the roots this server reads ({self.shown()})")
            return resolved
        raise Refused(f"{path}: no such file or folder under the roots ({self.shown()})")

    def scan(self, path: Path) -> tuple:
        """What `path` holds, as (relative name, size, mtime) of every file, its links followed; `Refused`
        when a link inside leads outside every root, or when it holds too many entries to be one run."""
        if not path.is_dir():
            info = path.stat()
            return ((path.name, info.st_size, info.st_mtime_ns),)
        found, pending, seen, entries = [], [path], {path}, 0
        while pending:
            folder = pending.pop()
            try:
                children = list(os.scandir(folder))
            except OSError:
                continue  # an unreadable folder: the analysis says what it cannot read
            for entry in children:
                entries += 1
                if entries > MAX_SCANNED_ENTRIES:
                    raise Refused(
                        f"{path}: holds more than {MAX_SCANNED_ENTRIES:,} files and folders; name one run, "
                        "job or log folder inside it (list_runs shows them)"
                    )
                target = Path(entry.path)
                if entry.is_symlink():
                    try:
                        target = target.resolve(strict=True)
                    except (OSError, RuntimeError):
                        continue  # a broken link leads nowhere
                    if not self.within(target):
                        raise Refused(
                            f"{path}: {entry.path} is a link to {target}, outside the roots this server "
                            f"reads ({self.shown()})"
                        )
                try:
                    info = target.stat()
                except OSError:
                    continue
                if target.is_dir():
                    if target not in seen:
                        seen.add(target)
                        pending.append(target)
                else:
                    found.append((os.path.relpath(entry.path, path), info.st_size, info.st_mtime_ns))
        return tuple(sorted(found))

    def shown(self) -> str:
        return ", ".join(str(root) for root in self.folders)


def _json(value) -> str:
    from analysis.render.json import jsonable

    return json.dumps(jsonable(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _records(frame, limit: int, offset: int = 0) -> list[dict]:
    from analysis.render.json import records

    return records(frame.iloc[offset : offset + limit], ("step", "steps"))


def _bounded(value: int, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Refused(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    return value


class Tools:
    """The server's tools over `roots`, each returning JSON text; a `Refused` (or the analysis' own
    error) says why a call gives nothing."""

    def __init__(self, roots: Roots):
        self.roots = roots
        self._analyses: OrderedDict = OrderedDict()
        self._lock = threading.Lock()  # one analysis at a time: memory, and one cache

    def analysis(self, path: str, step_name: str | None = None):
        """The analysis of `path` (under the roots), from the cache while its files are unchanged."""
        import analysis

        resolved = self.roots.resolve(path)
        with self._lock:
            key = (resolved, step_name)
            signature = self.roots.scan(resolved)
            cached = self._analyses.get(key)
            if cached is not None and cached[0] == signature:
                self._analyses.move_to_end(key)
                return cached[1]
            with warnings.catch_warnings(record=True) as caught:  # to the client, not the server's stderr
                warnings.simplefilter("always")
                result = analysis.analyze(resolved, step_name)  # returns the result; writes nothing
            said = tuple(dict.fromkeys(f"warning: {w.message}" for w in caught if issubclass(w.category, UserWarning)))
            if said:
                result = dataclasses.replace(result, notes=(*said, *result.notes))
            self._analyses[key] = (signature, result)
            self._analyses.move_to_end(key)
            while len(self._analyses) > CACHED_ANALYSES:
                self._analyses.popitem(last=False)
            return result

    def list_runs(self, root: str | None = None, limit: StrictInt = 100) -> str:
        limit = _bounded(limit, "limit", 1, MAX_LIST)
        folders = self.roots.folders if root is None else (self.roots.resolve(root),)
        if root is not None and not folders[0].is_dir():  # was an empty list, as if the folder held no run
            raise Refused(f"{root}: a file, not a folder; list_runs looks in a folder (analyze reads a file)")
        runs: dict[Path, dict] = {}
        too_deep: list[Path] = []
        for folder in folders:
            self._find_runs(folder, 0, runs, too_deep)
        listed = sorted(runs.values(), key=lambda run: (-run["modified_s"], run["path"]))
        answer = {
            "roots": [str(root) for root in self.roots.folders],
            "runs_total": len(listed),
            "runs": listed[:limit],
            "not_searched": None,
        }
        if too_deep:  # said, not left out in silence: list_runs with `root` set deeper lists them
            shown = ", ".join(str(folder) for folder in too_deep[:3]) + (", ..." if len(too_deep) > 3 else "")
            answer["not_searched"] = (
                f"{len(too_deep)} folder{'s' if len(too_deep) > 1 else ''} more than "
                f"{LIST_DEPTH} deep, not searched ({shown}): pass one as `root`"
            )
        return _json(answer)

    def _find_runs(self, folder: Path, depth: int, runs: dict, too_deep: list | None = None) -> None:
        if len(runs) >= MAX_SCANNED_ENTRIES:
            return
        if depth > LIST_DEPTH:
            if too_deep is not None:
                too_deep.append(folder)
            return
        kind = self._kind(folder)
        if kind is not None:
            runs[folder] = self._described(folder, kind)
            return
        try:
            children = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            return
        for entry in children:
            if entry.is_symlink():
                continue  # a link is listed where its target lies, if that is under a root
            if entry.is_dir():
                self._find_runs(Path(entry.path), depth + 1, runs, too_deep)
            elif entry.name.endswith(TRACE_SUFFIX) and entry.is_file():
                runs[Path(entry.path)] = self._described(Path(entry.path), "trace")

    @staticmethod
    def _kind(folder: Path) -> str | None:
        from analysis.read import run_files

        if (folder / run_files.STEPS_CSV).is_file() or (folder / run_files.RUN_JSON).is_file():
            return "job" if run_files.worker_dirs(folder) and not (folder / run_files.STEPS_CSV).is_file() else "run"
        if (folder / "plugins" / "profile").is_dir():
            return "log folder"
        return None

    @staticmethod
    def _described(path: Path, kind: str) -> dict:
        from analysis.read import run_files

        run: dict[str, str | float | None] = {"path": str(path), "kind": kind, "status": None, "device": None}
        try:
            run["modified_s"] = round(path.stat().st_mtime, 3)
        except OSError:
            run["modified_s"] = 0.0
        if kind in ("run", "job") and (path / run_files.RUN_JSON).is_file():
            try:
                meta = run_files.read_json(path / run_files.RUN_JSON, within=path)
            except run_files.RunFileError:
                return run
            if isinstance(meta, dict):
                found = meta.get("device")
                device = found if isinstance(found, dict) else {}
                run["status"] = meta.get("status") if isinstance(meta.get("status"), str) else None
                run["device"] = device.get("kind") if isinstance(device.get("kind"), str) else None
        return run

    def analyze(self, path: str, step_name: str | None = None) -> str:
        from analysis.render import summary

        return summary.dumps(summary.summary_document(self.analysis(path, step_name)))

    def findings(self, path: str, step_name: str | None = None) -> str:
        result = self.analysis(path, step_name)
        return _json(
            {
                "source": str(result.path),
                "verdict": dict(result.verdict),
                "findings": list(result.findings),
                "notes": list(result.notes),
            }
        )

    def ops(self, path: str, limit: StrictInt = 20, step_name: str | None = None) -> str:
        limit = _bounded(limit, "limit", 1, MAX_OPS)
        result = self.analysis(path, step_name)
        return _json(
            {
                "source": str(result.path),
                "ops_total": len(result.ops),
                "ops": _records(result.ops, limit),
                "roofline": result.roofline,
            }
        )

    def steps(self, path: str, limit: StrictInt = 50, offset: StrictInt = 0, step_name: str | None = None) -> str:
        from analysis.render.json import MEAN_KEYS, STEP_KEYS, UTILIZATION_KEYS

        limit = _bounded(limit, "limit", 1, MAX_STEPS)
        result = self.analysis(path, step_name)
        offset = _bounded(offset, "offset", 0, max(len(result.steps), 0))
        columns = STEP_KEYS + [key for key in UTILIZATION_KEYS if key in result.steps]
        return _json(
            {
                "source": str(result.path),
                "step_source": result.step_source,
                "steps_total": len(result.steps),
                "offset": offset,
                "steps": _records(result.steps[columns], limit, offset),
                "steps_used": int(result.steps_used),
                "mean": {key: result.mean.get(key) for key in MEAN_KEYS},
                "spread": result.spread,
            }
        )

    def compare(self, paths: list[str], baseline: str | None = None) -> str:
        import analysis
        from analysis.render.json import comparison_document

        if not isinstance(paths, list) or not 1 <= len(paths) <= 32:
            raise Refused("paths: a list of 1 to 32 run directories under the roots")
        resolved = [self.roots.resolve(path) for path in paths]
        with self._lock:
            for path in resolved:
                self.roots.scan(path)
            comparison = analysis.compare([str(path) for path in resolved], baseline=baseline)
        return _json(comparison_document(comparison))

    def explain_rule(self, rule: str, path: str | None = None, step_name: str | None = None) -> str:
        from analysis.rules import table
        from analysis.rules.facts import make_facts

        found = table.RULES_BY_ID.get(rule) if isinstance(rule, str) else None
        if found is None:
            raise Refused(f"no rule {rule!r}; the rules are {', '.join(table.RULES_BY_ID)}")
        result = self.analysis(path, step_name) if path is not None else None
        facts = result.facts if result is not None else make_facts(input_pct=None, host_pct=None)
        applies, fix = None, None
        if result is not None:  # where it applies, the advice the analysis gave
            verdict = result.verdict
            given = [
                item.get("advice")
                for item in (*(verdict.get("fixes") or ()), *result.findings)
                if item.get("rule") == found.id
            ]
            if found.id == verdict.get("rule") and verdict.get("advice"):
                given.append(verdict["advice"][0])
            applies = bool(given)
            fix = next((advice for advice in given if isinstance(advice, str)), None)
        if fix is None:
            try:
                fix = found.fix(facts)
            except Exception:  # noqa: BLE001 - a fix worded from a run's numbers has no general wording
                fix = None
        note = None
        if fix is None:
            note = (
                "it words its fix from the numbers of a run it applies to; it does not apply to this one"
                if result is not None
                else "it words its fix from a run's numbers: pass the path of a run"
            )
        return _json(
            {
                "rule": found.id,
                "component": found.component,
                "severity": found.severity,
                "bound": found.bound,
                "level": found.level,
                "finding": found.finding,
                "description": found.description,
                "fix": fix,
                "fix_for": str(result.path) if result is not None else "any run",
                "applies": applies,
                "note": note,
            }
        )


TOOL_DESCRIPTIONS = {
    "list_runs": "The runs, jobs, log folders and .xplane.pb traces under the server's roots (or under `root`), "
    "newest first: their paths to pass to the other tools, kind, status and device.",
    "analyze": "The summary of one run, log folder or trace (JSON, schema devprof.summary/1, at most 8 KB): the "
    "verdict and what its fix saves, the findings ranked by saving, the top ops with their roofline share, "
    "the spread of step times, memory and utilization headlines. `step_name` (a regex) picks the marker "
    "or program that stands for a step.",
    "findings": "The verdict (bound, its share, evidence, the fixes ranked by saving, advice) and every finding (rule, severity, "
    "evidence, saving, advice) of one run, in full.",
    "ops": "The ops of the steady steps, biggest first (up to `limit`): time per step, share, FLOPs, bytes, "
    "intensity, roofline bound and share of the ceiling; with the roofline's totals.",
    "steps": "The steps found (from `offset`, up to `limit`): each step's input, compute, collective and host ms, "
    "compile and partial flags, per-step utilization; with the steady steps' mean and spread.",
    "compare": "Runs side by side (devprof compare): seconds per epoch, the parts of the step, and the reason for "
    "every gap against the baseline (default: the slowest).",
    "explain_rule": "What a rule of devprof's rules table checks (its description) and its fix: in general, or for "
    "the run at `path` with whether it applies there.",
}


def build_server(roots: Roots):
    """The MCP server of `Tools(roots)`: every tool read-only, errors as tool errors with the reason."""
    import functools

    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:  # the SDK before 2.0 named it FastMCP (the checker sees the 2.x installed)
        from mcp.server.fastmcp import FastMCP as MCPServer  # type: ignore[no-redef,attr-defined]
        from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef]
    from mcp.types import ToolAnnotations

    # The SDK logs every refused call as a several-line INFO block on stderr: the client gets the reason
    logging.getLogger("mcp").setLevel(logging.WARNING)
    tools = Tools(roots)
    server = MCPServer(
        "devprof",
        instructions=(
            "devprof explains why a TensorFlow (or JAX) training step is slow from its profiler trace. Start with "
            "list_runs, then analyze a run's path for its verdict and findings; ops, steps and findings give the "
            f"detail, explain_rule a rule's meaning and fix. Paths must lie under: {roots.shown()}."
        ),
    )
    # The camelCase names are the SDK 2.x models' aliases (an alias_generator, which type checkers do
    # not see) and the SDK 1.x fields: both take them.
    annotations = ToolAnnotations(
        readOnlyHint=True,
        destructiveHint=False,  # type: ignore[call-arg]
        idempotentHint=True,
        openWorldHint=False,
    )

    def as_tool(method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            try:
                return method(*args, **kwargs)
            except ToolError:
                raise
            except (Refused, ValueError, TypeError, OSError) as exc:
                raise ToolError(str(exc)) from None
            except Exception as exc:  # noqa: BLE001 - the analysis' own errors (TraceError, CompareError), one line
                first = str(exc).strip().splitlines()
                raise ToolError(f"{type(exc).__name__}: {first[0] if first else 'no detail'}") from None

        return call

    for name, description in TOOL_DESCRIPTIONS.items():
        server.add_tool(as_tool(getattr(tools, name)), name=name, description=description, annotations=annotations)
    return server


def serve(roots: Roots) -> None:
    """Answer MCP requests on stdin/stdout until the client closes them."""
    build_server(roots).run("stdio")
