"""Writing a file safely: under a temporary name in the same folder, then renamed into place.

A full disk or a crash never leaves a cut or empty file where a complete one is expected; the
rename replaces a link at that name instead of writing through it, and the temporary file is
made new (never an existing name, so never through a link). A run's own folder for the
outputs (`<run>/analysis`) that is a link out of the run is refused: writing there would
overwrite another folder's files.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from pathlib import Path


def temporary_path(path: Path) -> Path:
    """A new, empty file beside `path` that no other writer uses, with the same suffix (plots pick
    their format by it); created exclusively, so an existing name or link is never written through."""
    fd, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would make the outputs private to their writer
    finally:
        os.close(fd)
    return Path(name)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# A path that names one of the process's open files: /dev/stdout is a link to /proc/self/fd/1, and
# that to whatever the shell opened, often a regular file (`-o /dev/stdout > report.json`).
_DESCRIPTOR_PATH = re.compile(r"^/(?:proc/(?:self|thread-self|\d+)|dev)/fd/\d+$|^/dev/std(?:out|err)$")


def names_a_descriptor(path: Path) -> bool:
    """Whether `path`, or a link on the way to its target, is /dev/stdout, /dev/fd/N or /proc/PID/fd/N."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's own bound on links followed
        if _DESCRIPTOR_PATH.match(current):
            return True
        if not os.path.islink(current):
            return False
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
    return False


def is_stream(path: Path) -> bool:
    """Whether `path` (links followed) is a terminal, /dev/null, a FIFO, a pipe (a shell's `>(...)`) or
    one of the process's open files (/dev/stdout): an output the user named there is written into,
    as a shell's `>` would; renaming a file over it would replace /dev/null or /dev/stdout itself.
    A block device or a socket is an OSError: never written."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
        kind = "a block device" if stat.S_ISBLK(mode) else "a socket"
        raise OSError(f"{kind}, not written")
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or names_a_descriptor(path)


def open_stream(path: Path):
    """`path` (a stream, `is_stream`) open for writing bytes at its end: a file the shell opened
    behind /dev/stdout keeps what is already in it (`>>`), and nothing is created."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND), "wb")


# Characters a terminal, a viewer or a browser acts on rather than shows (line breaks and tabs aside):
# whatever an input held (a run.json field, a file name), an output shows them as `\u001b`, which JSON
# also reads as the character itself. Trace names are escaped where they are read (`xplane_wire.visible`).
_ACTING = [
    *(c for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)),
    0x7F,
    *range(0x80, 0xA0),
    0x2028,
    0x2029,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_INERT = {code: f"\\u{code:04x}" for code in _ACTING}


def inert(text: str) -> str:
    """`text` with every character that would act (`_ACTING`) written as its `\\uXXXX` escape."""
    return text.translate(_INERT)


def write_text_atomically(path: Path, text: str, named: bool = False) -> Path:
    """`text` in `path`, complete or not at all, its acting characters inert (`inert`). `named`: the user
    chose `path` (-o), so a terminal, /dev/null or a FIFO there is written into (`is_stream`); a run's own
    files never are."""
    text = inert(text)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"{path} is a folder", str(path))
    if named and is_stream(path):
        with open_stream(path) as stream:
            stream.write(text.encode("utf-8"))
        return path
    tmp = temporary_path(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class OutsideRunError(OSError):
    """The folder to write into lies inside a run directory but leads (by a link) out of it."""


def check_inside(out_dir: Path, run_folder: Path | None) -> None:
    """Refuse `out_dir` when it is named inside `run_folder` but a link takes it outside."""
    if run_folder is None:
        return
    absolute, folder = Path(os.path.abspath(out_dir)), Path(os.path.abspath(run_folder))
    if not absolute.is_relative_to(folder):
        return  # a folder the user chose elsewhere
    resolved_folder = folder.resolve()
    if not absolute.resolve().is_relative_to(resolved_folder):
        message = f"{out_dir} is a link to {absolute.resolve()}, outside the run folder {folder}: not written"
        raise OutsideRunError(errno.EPERM, message)
