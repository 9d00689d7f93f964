"""A real tiny run says what it does: the test pass names the images it evaluates, and run.json's
`config.validation_images` is the number validated (beside `data.val_images`)."""

from __future__ import annotations

import json

import pytest

from profiler import cli


@pytest.mark.slow
def test_a_run_on_fewer_test_images_says_so(tmp_path, capsys):
    code = cli.main(["run", "--device", "cpu", "--data", "synthetic", "--limit-images", "100", "--limit-test-images",
                     "100", "--epochs", "1", "--batch-size", "50", "--no-profile", "--no-sample", "--out",
                     str(tmp_path), "--run-name", "r"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Evaluating on the first 100 test images (--limit-test-images)..." in captured.out.splitlines()
    assert "whole test set" not in captured.out
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["config"]["validation_images"] == 100 == meta["data"]["val_images"]
    assert meta["config"]["limit_test_images"] == 100 and meta["test"]["images"] == 100
