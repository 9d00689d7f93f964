"""Test helpers in tests/support/ (`trace_fixtures`, `fake_pynvml`) import by their plain names,
however pytest is started (from the repository root, from tests/, or with --import-mode=importlib)."""

import sys
from pathlib import Path

SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)

# Test tiers: `pytest -m "not slow"` runs in seconds. A test that trains, imports TensorFlow
# or starts a subprocess must be marked `slow`; unmarked tests are held to it here: starting a
# process fails them at once, and loading TensorFlow or Keras fails them at teardown.
import subprocess  # noqa: E402

import pytest  # noqa: E402

HEAVY_MODULES = ("tensorflow", "keras")
_fast_test: dict = {}  # the unmarked test running now: {"id", "heavy_before"}


def _heavy_loaded() -> bool:
    return any(name in sys.modules for name in HEAVY_MODULES)


_popen_init = subprocess.Popen.__init__


def _guarded_popen_init(self, *args, **kwargs):
    if _fast_test and not _fast_test.get("tool"):
        raise RuntimeError(f"{_fast_test['id']} starts a subprocess: mark it @pytest.mark.slow")
    _popen_init(self, *args, **kwargs)


setattr(subprocess.Popen, "__init__", _guarded_popen_init)  # a method replaced on purpose, which mypy refuses


_own_cache_dir: list = []  # the cache folder this session made, removed when it ends
_OWN_CACHE_ENV = "DEVPROF_TEST_OWN_CACHE"  # DEVPROF_CACHE_DIR is the tests' own, not the developer's


def pytest_unconfigure(config):
    import shutil

    for folder in _own_cache_dir:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_configure(config):
    import os
    import tempfile

    # Runs carry the device's cached peak: the tests' runs see only peaks the tests measure, never the
    # developer's own cache (a peak there would change what their analyses say). Each of pytest-xdist's
    # workers (`-n 2`) gets its own, so that what one's tests measure never reaches the other's.
    if "DEVPROF_CACHE_DIR" not in os.environ or os.environ.get(_OWN_CACHE_ENV) and hasattr(config, "workerinput"):
        _own_cache_dir.append(tempfile.mkdtemp(prefix="devprof-test-cache-"))
        os.environ["DEVPROF_CACHE_DIR"] = _own_cache_dir[0]
        os.environ[_OWN_CACHE_ENV] = "1"
    config.addinivalue_line("markers", "slow: trains, imports TensorFlow or starts a subprocess")
    config.addinivalue_line("markers", "tool: runs a linter as a subprocess (a fraction of a second: stays fast)")
    config.addinivalue_line(
        "markers",
        "hogs: keeps the CPU busy on purpose (busy-loop processes): run in a pass of their own, after the others, "
        "so that no other test is timed beside them",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("slow") is None:
        _fast_test.update(
            id=item.nodeid, heavy_before=_heavy_loaded(), tool=item.get_closest_marker("tool") is not None
        )
    try:
        yield
    finally:
        _fast_test.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and _fast_test and not _fast_test["heavy_before"] and _heavy_loaded():
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} loaded TensorFlow or Keras: mark it @pytest.mark.slow"


def pytest_ignore_collect(collection_path, config):
    """With `-m "not slow"`, a module marked slow as a whole is not even imported (its imports load TensorFlow)."""
    if (
        collection_path.suffix == ".py"
        and collection_path.name.startswith("test_")
        and config.getoption("markexpr", "").replace(" ", "") == "notslow"
    ):
        return "\npytestmark = pytest.mark.slow" in collection_path.read_text()
    return None
