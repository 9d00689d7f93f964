"""A job's worker traces analysed in parallel processes give exactly the sequential result."""

from __future__ import annotations

import pandas as pd
import pytest

import trace_fixtures as fx
from analysis import job, pipeline


@pytest.mark.slow  # forks worker processes
def test_parallel_analysis_of_a_session_equals_the_sequential_one(tmp_path):
    session = fx.write_synthetic_session(tmp_path / "logs", workers=3, slow_worker=2, slow_part="host")
    one = pipeline.analyze(session.logdir, processes=1)
    several = pipeline.analyze(session.logdir, processes=3)
    assert one.to_json() == several.to_json()
    pd.testing.assert_frame_equal(one.workers, several.workers)
    pd.testing.assert_frame_equal(one.steps, several.steps)
    assert several.straggler is not None
    assert several.straggler["worker"] == "worker2"


def test_the_pool_is_bounded_by_cores_memory_and_trace_size(tmp_path, monkeypatch):
    small = [tmp_path / f"w{i}.xplane.pb" for i in range(4)]
    for path in small:
        path.write_bytes(b"x" * 1000)
    assert job.pool_size(small) == 1  # small traces: one process is faster
    assert job.pool_size(small, processes=8) == 4  # never more than the files
    monkeypatch.setattr(job, "POOL_MIN_TRACE_BYTES", 100)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert job.pool_size(small) == 2

    class Memory:
        available = 1000 * job.MEMORY_PER_TRACE_BYTE  # room for one trace of 1000 bytes

    monkeypatch.setattr("psutil.virtual_memory", lambda: Memory())
    assert job.pool_size(small) == 1
