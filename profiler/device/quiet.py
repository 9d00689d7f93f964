"""Keep TensorFlow's and gRPC's native chatter off the console; keep real errors visible.

TensorFlow prints a few lines on every start (oneDNN notes, "Could not find cuda drivers", and
on a machine without a GPU driver "failed call to cuInit: ... (303)") through absl before
absl's log is initialized, so `TF_CPP_MIN_LOG_LEVEL` does not reach them. They are written
by C++ to file descriptor 2, so the only way to keep them out is to point that descriptor
elsewhere while TensorFlow starts, and then pass on every line the log level lets through.

`TF_CPP_MIN_LOG_LEVEL` keeps its meaning for these lines too (devprof's default is 2: errors
only; 1 adds warnings, 0 shows everything), and `DEVPROF_DEBUG=1` shows everything unfiltered.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading

LOG_LEVEL_VAR = "TF_CPP_MIN_LOG_LEVEL"
DEFAULT_LOG_LEVEL = "2"  # C++ INFO and WARNING off; ERROR stays visible

# absl's lines before its log is initialized ("I0000 00:00:1795386464.557924   13046 port.cc:153] ...").
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ [^\]\s]+:\d+\] ")
_ABSL_PREAMBLE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
)
# No GPU driver on this machine: TensorFlow says so as an error, but the CPU is used as asked.
_NO_GPU_DRIVER = re.compile(r"failed call to cuInit")
# oneDNN on a CPU without AVX-512 says, as an error, that bfloat16 stays on Eigen: a fact of the CPU
# that run.json's device.bfloat16_units already records.
_ONEDNN_NO_BF16 = re.compile(r"oneDNN supports DT_BFLOAT16 only on platforms with AVX-512")
_LEVELS = {"I": 0, "W": 1, "E": 2, "F": 3}


def configure() -> None:
    """Set TensorFlow's C++ log level unless the user chose one (call before TensorFlow is imported).

    A value that is no whole number is level 0 to TensorFlow (every INFO line) and 2 to the filter
    here: it is replaced by the default, with a warning unless it is empty (an unset variable's spelling)."""
    value = os.environ.get(LOG_LEVEL_VAR)
    if value is not None and not re.fullmatch(r"\s*[+-]?\d+\s*", value):
        if value.strip():
            print(
                f"warning: {LOG_LEVEL_VAR}={value!r} is not a log level (0 all, 1 warnings, 2 errors, 3 fatal "
                f"only): using {DEFAULT_LOG_LEVEL}",
                file=sys.stderr,
            )
        os.environ[LOG_LEVEL_VAR] = DEFAULT_LOG_LEVEL
    os.environ.setdefault(LOG_LEVEL_VAR, DEFAULT_LOG_LEVEL)


def log_level() -> int:
    try:
        return int(os.environ.get(LOG_LEVEL_VAR, DEFAULT_LOG_LEVEL))
    except ValueError:
        return int(DEFAULT_LOG_LEVEL)


@contextlib.contextmanager
def tensorflow_python_warnings_off():
    """TensorFlow's Python log (`tf.get_logger()`) at errors only for the block: devprof's own measurements
    that trace one `tf.function` per size would each print its "triggered tf.function retracing" warning,
    advice for the user's code that does not apply (DEVPROF_DEBUG=1 or TF_CPP_MIN_LOG_LEVEL=0 keep it)."""
    import logging

    logger = logging.getLogger("tensorflow")
    level = logger.level
    if not verbose():
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


DEBUG_VAR = "DEVPROF_DEBUG"
DEBUG_ON = ("1", "true", "yes")  # anything else, DEVPROF_DEBUG=0 included, leaves debugging off


def debug() -> bool:
    """True when DEVPROF_DEBUG is 1, true or yes (any case): tracebacks and all native output."""
    return os.environ.get(DEBUG_VAR, "").strip().lower() in DEBUG_ON


def verbose() -> bool:
    """True when the user asked to see everything: DEVPROF_DEBUG=1, or TF_CPP_MIN_LOG_LEVEL=0."""
    return debug() or log_level() <= 0


def is_noise(line: str, level: int | None = None) -> bool:
    """Whether `line` is native chatter below the log level (`level`, default TF_CPP_MIN_LOG_LEVEL)."""
    level = log_level() if level is None else level
    if _ABSL_PREAMBLE.match(line):
        return level >= 1
    found = _ABSL_LINE.match(line)
    if not found:
        return False
    if _NO_GPU_DRIVER.search(line) or _ONEDNN_NO_BF16.search(line):
        return level >= 2
    return _LEVELS[found.group(1)] < level


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
    captured: list[str] = []
    try:
        with native_output((2,)) as captured:
            yield
    finally:  # also when the block failed: what it printed may say why
        kept = [line for line in "".join(captured).splitlines() if line.strip() and not is_noise(line)]
        if kept:
            print("\n".join(kept), file=sys.stderr, flush=True)


@contextlib.contextmanager
def stderr_dropped_on_failure():
    """Run the block with stderr held back: passed on (less native chatter) when it succeeds,
    dropped when it raises. For calls whose exception already says what went wrong, while
    TensorFlow and gRPC also log it, with source locations, as `E0000 ...` lines."""
    if verbose():
        yield
        return
    failed = False
    captured: list[str] = []
    try:
        with native_output((2,)) as captured:
            try:
                yield
            except BaseException:
                failed = True
                raise
    finally:
        kept = [line for line in "".join(captured).splitlines() if line.strip() and not is_noise(line)]
        if kept and not failed:
            print("\n".join(kept), file=sys.stderr, flush=True)


@contextlib.contextmanager
def filtered_stderr_stream(extra_noise: tuple[re.Pattern, ...] = ()):
    """For a long-running block (a server): stderr passes through a filter line by line, so
    native chatter (and lines matching `extra_noise`) never shows; everything else does, at once."""
    if verbose():
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        real = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError:
        yield
        return
    out = os.dup(real)

    def pump():
        with os.fdopen(read_end, "rb") as source, os.fdopen(out, "wb", buffering=0) as sink:
            for raw in source:
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                if not is_noise(line) and not any(p.search(line) for p in extra_noise):
                    sink.write(raw)

    os.dup2(write_end, 2)
    os.close(write_end)
    thread = threading.Thread(target=pump, name="devprof-stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(real, 2)  # the pipe closes once no child process holds it; the pump then ends
        os.close(real)
        thread.join(0.5)


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
