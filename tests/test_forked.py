"""Work done by a forked child (`analysis.read.forked`): the child's answer is the one this process
would compute, its warnings are reported here, and a child that gives no answer leaves its work to
this process; the analysis with its tf.data stages and eager execution analysed by a child is the
analysis without."""

from __future__ import annotations

import os
import signal
import warnings

import numpy as np
import pandas as pd
import pytest

from analysis import pipeline
from analysis.read import forked
from analysis.read.run_files import RunFileWarning
from test_input_stages import write_prefetched_map_loop


@pytest.fixture
def answers(monkeypatch):
    """What each forked child answered (None: nothing)."""
    seen = []
    result = forked.ForkedHalf.result

    def recorded(self, *args):
        answer = result(self, *args)
        seen.append(answer is not None)
        return answer

    monkeypatch.setattr(forked.ForkedHalf, "result", recorded)
    return seen


def test_the_childs_answer_and_its_warnings_are_this_processs(answers):
    parent = os.getpid()

    def work(given):
        warnings.warn(RunFileWarning("steps.csv: 2 rows skipped"), stacklevel=1)
        before = np.arange(100_000) * 3  # what needs nothing given
        return os.getpid(), before + given()

    with pytest.warns(RunFileWarning, match="2 rows skipped"):
        with forked.Beside(work, fork=True) as beside:
            beside.give(np.ones(100_000, dtype=np.int64))
            pid, values = beside.result()
    assert answers == [True] and pid != parent  # computed by the child, with what this process gave it
    assert np.array_equal(values, np.arange(100_000) * 3 + 1)
    assert not _children()


@pytest.mark.parametrize("answered", [True, False])
def test_what_waits_for_a_child_to_end_runs_once_after_the_first_one_has(answered, answers, monkeypatch):
    monkeypatch.setattr(forked, "_WHEN_A_CHILD_ENDS", [])
    parent, called = os.getpid(), []

    def work(given):
        if not answered and os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return "done"

    forked.call_when_a_child_ends(lambda: 1 / 0)  # the helper's error, not the caller's
    forked.call_when_a_child_ends(lambda: called.append(_children()))
    with forked.Beside(work, fork=True) as beside:
        beside.give(None)
        assert called == []
        assert beside.result() == "done"
    assert answers == [answered]
    assert called == [[]]  # once, with the child ended and reaped
    with forked.Beside(work, fork=True) as beside:
        beside.give(None)
        beside.result()
    assert called == [[]]


def test_a_child_that_gives_no_answer_leaves_the_work_here(answers):
    parent = os.getpid()

    def work(given):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return os.getpid(), given()

    with forked.Beside(work, fork=True) as beside:
        beside.give("steps")
        assert beside.result() == (parent, "steps")
    assert answers == [False] and not _children()


def test_an_error_in_the_work_is_raised_here_as_without_a_child(answers):
    def work(given):
        raise ValueError("a stage that cannot be analysed")

    with pytest.raises(ValueError, match="cannot be analysed"):
        with forked.Beside(work, fork=True) as beside:
            beside.give(None)
            beside.result()
    assert answers == [False] and not _children()


def test_a_child_whose_parent_gives_nothing_ends_without_an_answer(answers):
    with forked.Beside(lambda given: given(), fork=True) as beside:
        child = beside.child.pid
    assert answers == [] and not psutil_alive(child)


def psutil_alive(pid: int) -> bool:
    import psutil

    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def test_without_a_fork_the_work_is_done_when_asked(answers):
    done = []
    with forked.Beside(lambda given: done.append(os.getpid()) or given(), fork=False) as beside:
        beside.give("here")
        assert done == []
        assert beside.result() == "here"
    assert done == [os.getpid()] and answers == []


def test_the_analysis_is_the_same_with_its_stages_analysed_by_a_child(tmp_path, monkeypatch, answers):
    trace = write_prefetched_map_loop(tmp_path / "loop.xplane.pb", steps=8)
    monkeypatch.setattr(forked, "can_fork", lambda: False)
    alone = pipeline.analyze(trace)
    assert answers == []
    monkeypatch.setattr(forked, "can_fork", lambda: True)
    monkeypatch.setattr(pipeline, "BESIDE_MIN_EVENTS", 0)
    beside = pipeline.analyze(trace)
    assert answers == [True]
    assert not alone.input_stages.empty  # the child had stages to find
    pd.testing.assert_frame_equal(beside.input_stages, alone.input_stages)
    assert beside.render("json") == alone.render("json")
    assert beside.findings == alone.findings and beside.verdict == alone.verdict


def _children() -> list:
    import psutil

    return psutil.Process().children()


def test_the_command_begins_decoding_before_its_imports_and_prints_the_same(tmp_path, monkeypatch, capsys, answers):
    from analysis.read import xplane_wire as wire
    from profiler import cli

    write_prefetched_map_loop(tmp_path / "run" / "plugins" / "profile" / "s1" / "host.xplane.pb", steps=8)
    monkeypatch.setattr(wire, "CHUNK_EVENTS", 16)
    monkeypatch.setattr(wire, "HALVES_MIN_EVENTS", 0)
    # a machine where a fork is safe, DEVPROF_FORK=0 still turning it off
    monkeypatch.setattr(forked, "can_fork", lambda: os.environ.get(forked.ENV_VAR) != "0")
    taken = []
    take = wire.take
    monkeypatch.setattr(wire, "take", lambda *args: taken.append(take(*args)) or taken[-1])
    printed = {}
    for fork in ("1", "0"):
        monkeypatch.setenv(forked.ENV_VAR, fork)
        assert cli.main(["analyze", str(tmp_path / "run"), "--format", "json"]) == 0
        printed[fork] = capsys.readouterr().out
    assert [begun is not None for begun in taken] == [True, False]  # begun with DEVPROF_FORK=1 only
    assert answers[0] is True  # its child answered
    assert printed["1"] == printed["0"] and '"verdict"' in printed["1"]
    assert not wire._BEGUN and not _children()


@pytest.mark.parametrize("system", ["copies", "has no such call", "refuses", "copies part", "fails"])
def test_the_childs_arrays_are_the_same_copied_from_it_or_sent_through_the_pipe(answers, monkeypatch, system,
                                                                              system_copies_from_a_child):
    """More buffers than one process_vm_readv call takes, of several kinds and an empty one; where the
    system has no such call, refuses it, copies short or the call fails, the pipe sends them all."""
    calls = []
    real = forked._process_vm_readv()
    assert real is not None  # Linux: the copy is there to test

    def vm_readv(pid, local, count, remote, remote_count, flags):
        calls.append(count)
        if system == "fails":
            raise OSError("as a broken call would")
        if system == "refuses" or (system == "copies part" and len(calls) == 2):
            return -1
        return real(pid, local, count, remote, remote_count, flags)

    monkeypatch.setattr(forked, "_process_vm_readv", lambda: None if system == "has no such call" else vm_readv)
    expected = [np.arange(1 + i % 7, dtype=np.int64) * i for i in range(forked.IOV_MAX + 100)]
    expected += [np.linspace(0, 1, 300_001), np.array([], dtype=np.uint8), np.frombuffer(b"read-only", dtype=np.uint8)]
    with forked.Beside(lambda given: [np.array(array) for array in expected], fork=True) as beside:
        got = beside.result()
    assert answers == [True]
    assert len(got) == len(expected)
    for mine, theirs in zip(expected, got):
        assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)
    both = [forked.IOV_MAX, 100 + 2] if system_copies_from_a_child else [forked.IOV_MAX]  # else the first is refused
    assert calls == {"copies": both, "has no such call": [], "refuses": [forked.IOV_MAX], "copies part": both,
                     "fails": [forked.IOV_MAX]}[system]
    assert not _children()
