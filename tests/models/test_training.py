"""The training loop's bookkeeping without TensorFlow: finished tf.data iterators are kept, not destroyed
on the loop's thread, and not destroyed at exit either."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from repo_paths import REPO


class _Iterator:
    """Stands for a tf.data iterator, whose destructor can wait up to a minute for its autotuning
    thread: records that it was destroyed."""

    destroyed = 0

    def __init__(self, batches=()):
        self.batches = list(batches)

    def __iter__(self):
        return self

    def __next__(self):
        if not self.batches:
            raise StopIteration
        return self.batches.pop()

    def __del__(self):
        _Iterator.destroyed += 1


class _Dataset:
    def __iter__(self):
        return _Iterator([0, 1, 2])


# ---------------------------------------------------------------- no silent wait after the last epoch


def test_the_loop_keeps_its_finished_iterators_instead_of_waiting_to_destroy_them(monkeypatch):
    from models import training

    monkeypatch.setattr(training, "_retired", [], raising=False)
    monkeypatch.setattr(training, "_kept_at_exit", True, raising=False)  # this test process keeps its own exit
    _Iterator.destroyed = 0
    trainer = training.Trainer.__new__(training.Trainer)  # the loop's bookkeeping only: no TensorFlow
    trainer.hooks, trainer.config = training.LoopHooks(), cast(training.TrainConfig, SimpleNamespace(epochs=1))
    trainer._iterator = trainer._val_iterator = None

    def train_epoch(epoch):
        trainer._iterator, trainer._val_iterator = _Iterator(), _Iterator()

    monkeypatch.setattr(trainer, "train_epoch", train_epoch)
    trainer.fit()
    assert trainer._iterator is None and trainer._val_iterator is None
    trainer.classification, trainer.test_ds = True, _Dataset()
    trainer._eval_one = lambda batch: (1.0, 1.0, 2.0)  # loss sum, correct, count
    result = trainer.evaluate()
    assert result == (0.5, 0.5)
    assert _Iterator.destroyed == 0, "destroyed on the loop's thread"
    assert len(training._retired) == 3  # training, validation, test


@pytest.mark.slow  # a subprocess; no TensorFlow
def test_kept_iterators_are_not_destroyed_when_the_process_exits(tmp_path):
    import subprocess
    import sys

    script = """
from models import training

class Iterator:
    def __del__(self):
        print("destroyed", flush=True)

training.retire_iterators([Iterator(), None])
print("exiting", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["exiting"]  # no destructor ran at exit, so none waited
