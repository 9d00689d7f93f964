"""Where a trace lies: a user's path resolved to one `.xplane.pb` (`locate_trace`), and the errors of
reading one. No numpy or pandas: `devprof analyze` asks this before it imports them, to begin
decoding the trace on another core while it does (`analysis.parallel`).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a path that is not a regular file is, for messages ('a FIFO', 'a character device', ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


GZIP_SUFFIX = ".gz"

TRACE_SUFFIX = ".xplane.pb"
PROFILE_SUBDIR = Path("plugins") / "profile"


class TraceError(Exception):
    """A trace could not be found, read, or has nothing to analyse."""


class TraceNotFound(TraceError):
    """No `.xplane.pb` where the path points."""


class TraceUnreadable(TraceError):
    """A trace file is there but cannot be parsed: truncated (e.g. a full disk) or not a trace."""


@dataclass(frozen=True)
class TraceLocation:
    """Where a trace came from: the path asked for, the file read and which session."""

    requested: Path
    xplane: Path
    session: str
    run_dir: Path | None
    note: str = ""
    host_files: tuple[Path, ...] = ()  # every host's trace in the session (several workers), `xplane` first


def _sessions_under(profile_dir: Path) -> list[Path]:
    return sorted(
        (d for d in profile_dir.iterdir() if d.is_dir() and any(d.glob("*" + TRACE_SUFFIX))),
        key=lambda d: (d.name, d.stat().st_mtime),
    )


def locate_trace(path: str | Path) -> TraceLocation:
    """Resolve a user path to one `.xplane.pb`.

    Accepts a devprof run directory, a TensorBoard log folder holding
    `plugins/profile` (at any depth, as Keras writes `<logdir>/train/plugins/...`),
    one profile session folder, or the file itself. With several sessions the newest
    (session names are timestamps) is used and the note says so.
    """
    requested = Path(path)
    if not requested.exists():
        raise TraceNotFound(f"no such file or directory: {requested}")
    if not requested.is_dir() and not requested.is_file():
        raise TraceError(f"{requested} is {_kind_of(requested)}, not a profiler trace file")
    if requested.is_file():
        if requested.name.endswith(TRACE_SUFFIX + GZIP_SUFFIX):
            raise TraceError(
                f"{requested} is gzipped: unzip it first (gunzip -k '{requested}') and analyse the {TRACE_SUFFIX} file"
            )
        if not requested.name.endswith(TRACE_SUFFIX):
            raise TraceError(f"{requested} is not a profiler trace: expected a file named *{TRACE_SUFFIX}")
        return TraceLocation(requested, requested, requested.parent.name, _run_dir_of(requested), "", (requested,))

    direct = sorted(requested.glob("*" + TRACE_SUFFIX))
    if direct:
        note = _several_hosts_note(direct)
        return TraceLocation(requested, direct[0], requested.name, _run_dir_of(direct[0]), note, tuple(direct))

    sessions: list[Path] = []
    profile_dirs = [p for p in requested.glob("**/" + str(PROFILE_SUBDIR)) if p.is_dir()]
    if requested.resolve().match(str(PROFILE_SUBDIR)):  # the profile folder itself was given
        profile_dirs.append(requested)
    for profile_dir in sorted(profile_dirs):
        sessions.extend(_sessions_under(profile_dir))
    if not sessions:
        raise TraceNotFound(
            f"no profiler trace in {requested}: looked for */{PROFILE_SUBDIR}/<session>/*{TRACE_SUFFIX}"
            f" and *{TRACE_SUFFIX}; found {_describe_contents(requested)}{_gzipped_note(requested, profile_dirs)}"
        )
    sessions.sort(key=lambda d: (d.name, d.stat().st_mtime))
    newest = sessions[-1]
    files = sorted(newest.glob("*" + TRACE_SUFFIX))
    note = ""
    if len(sessions) > 1:
        note = f"{len(sessions)} profile sessions found; using the newest, {newest.name}"
    more = _several_hosts_note(files)
    note = "; ".join(n for n in (note, more) if n)
    return TraceLocation(requested, files[0], newest.name, _run_dir_of(files[0]), note, tuple(files))


def _several_hosts_note(files: list[Path]) -> str:
    if len(files) > 1:
        return f"{len(files)} host traces in the session: the breakdown is {files[0].name}'s, one row per worker below"
    return ""


def _run_dir_of(xplane: Path) -> Path | None:
    """The devprof run directory holding this trace: the folder of TensorBoard's log layout
    (`RUN/plugins/profile/SESSION/HOST.xplane.pb`) where it has a run.json. Never a run.json further up:
    an unrelated run's settings and steps would be read (and its folder written to)."""
    parents = xplane.parents
    if (
        len(parents) > 3
        and parents[1].name == "profile"
        and parents[2].name == "plugins"
        and (parents[3] / "run.json").is_file()
    ):
        return parents[3]
    return None


def _describe_contents(folder: Path) -> str:
    entries = sorted(p.name for p in folder.iterdir())
    if not entries:
        return "an empty folder"
    shown = ", ".join(entries[:8]) + (", ..." if len(entries) > 8 else "")
    return f"{len(entries)} {'entry' if len(entries) == 1 else 'entries'} ({shown})"


def _gzipped_note(folder: Path, profile_dirs: list[Path]) -> str:
    """A hint when the only traces there are gzipped (`*.xplane.pb.gz`): devprof reads them unzipped."""
    pattern = "*" + TRACE_SUFFIX + GZIP_SUFFIX
    found = sorted(folder.glob(pattern)) + sorted(f for d in profile_dirs for f in d.glob("*/" + pattern))
    if not found:
        return ""
    return (
        f"; {found[0]}{f' and {len(found) - 1} more' if len(found) > 1 else ''} is gzipped: unzip it first "
        f"(gunzip -k FILE) so that it is a {TRACE_SUFFIX} file"
    )


def _kind_of(path: Path) -> str:
    try:
        return file_kind(path.stat().st_mode)
    except OSError:
        return "unreadable"
