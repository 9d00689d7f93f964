"""Keep TensorFlow's and gRPC's native chatter off the console; keep real errors visible.

TensorFlow prints a few lines on every start (oneDNN notes, "Could not find cuda drivers", and
on a machine without a GPU driver "failed call to cuInit: ... (303)") through absl before
absl's log is initialized, so `TF_CPP_MIN_LOG_LEVEL` does not reach them. They are written
by C++ to file descriptor 2, so the only way to keep them out is to point that descriptor
elsewhere while TensorFlow starts, and then pass on every line that is not such chatter.

`DEVPROF_DEBUG=1`, or a `TF_CPP_MIN_LOG_LEVEL` the user set, shows everything unfiltered.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

LOG_LEVEL_VAR = "TF_CPP_MIN_LOG_LEVEL"
DEFAULT_LOG_LEVEL = "2"  # C++ INFO and WARNING off during training; ERROR stays visible

# absl's INFO and WARNING lines ("I0000 00:00:1795386464.557924   13046 port.cc:153] ...").
_ABSL_INFO_OR_WARNING = re.compile(r"^[IW]\d{4} [\d:.]+\s+\d+ [^\]\s]+:\d+\] ")
_NOISE = (
    _ABSL_INFO_OR_WARNING,
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"),
    # No GPU driver on this machine: TensorFlow says so as an error, but the CPU is used as asked.
    re.compile(r"^E\d{4} .*failed call to cuInit"),
)

_set_by_devprof = False


def configure() -> None:
    """Set TensorFlow's C++ log level unless the user chose one (call before TensorFlow is imported)."""
    global _set_by_devprof
    if LOG_LEVEL_VAR not in os.environ:
        os.environ[LOG_LEVEL_VAR] = DEFAULT_LOG_LEVEL
        _set_by_devprof = True


def verbose() -> bool:
    """True when the user asked to see everything: DEVPROF_DEBUG, or their own TF_CPP_MIN_LOG_LEVEL."""
    return bool(os.environ.get("DEVPROF_DEBUG")) or not _set_by_devprof


def is_noise(line: str) -> bool:
    return any(pattern.search(line) for pattern in _NOISE)


@contextlib.contextmanager
def native_output(fds: tuple[int, ...] = (2,)):
    """Send what C++ (and Python) write to `fds` into a buffer; yields a list that holds the
    captured text once the block ends."""
    captured: list[str] = []
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        try:
            for fd in fds:
                saved.append((fd, os.dup(fd)))
                os.dup2(sink.fileno(), fd)
        except OSError:  # no such descriptor (a daemon without stderr): nothing to capture
            for fd, copy in saved:
                os.dup2(copy, fd)
                os.close(copy)
            yield captured
            return
        try:
            yield captured
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd, copy in reversed(saved):
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            captured.append(sink.read().decode("utf-8", errors="replace"))


@contextlib.contextmanager
def filtered_stderr():
    """Run the block with its native chatter dropped; every other stderr line is passed on after it."""
    if verbose():
        yield
        return
    with native_output((2,)) as captured:
        yield
    kept = [line for line in "".join(captured).splitlines() if line.strip() and not is_noise(line)]
    if kept:
        print("\n".join(kept), file=sys.stderr, flush=True)


def import_tensorflow():
    """Import TensorFlow and find its devices (where cuInit runs) without the start-up chatter."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    with filtered_stderr():
        import tensorflow as tf

        tf.config.list_physical_devices()
    return tf


def one_line_reason(text: str) -> str | None:
    """The first error a native library logged in `text`, as one line without absl's prefix."""
    for line in text.splitlines():
        found = re.match(r"^E\d{4} [\d:.]+\s+\d+ [^\]\s]+:\d+\] (.+)$", line)
        if found:
            return found.group(1).strip()
    return None
