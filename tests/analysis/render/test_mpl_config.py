"""Where matplotlib's own folder cannot be written (a read-only or missing HOME), devprof's PNGs are
drawn without matplotlib's two lines about a temporary folder and with one font cache kept between
runs, in devprof's folder, which is this user's alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from analysis.render import mpl_config
from memory_fixtures import write_memory_trace
from repo_paths import REPO


@pytest.mark.slow
@pytest.mark.parametrize("helper", ["1", "0"], ids=["plot helper", "one process"])
def test_an_unwritable_home_draws_the_pngs_without_matplotlibs_complaint(tmp_path, helper):
    trace = write_memory_trace(tmp_path / "run" / "host.xplane.pb", steps=4).path
    env = {key: value for key, value in os.environ.items() if key not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME")}
    env.update(HOME="/proc/self", TMPDIR=str(tmp_path), DEVPROF_FORK=helper)  # no ~/.config can be made there
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-m", "profiler", "analyze", str(trace), "--out", str(tmp_path / "out")],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "matplotlib" not in done.stderr.lower(), done.stderr
    assert (tmp_path / "out" / "step_breakdown.png").read_bytes()[:4] == b"\x89PNG"
    own = tmp_path / f"devprof-matplotlib-{os.getuid()}"
    assert list(own.glob("fontlist-*.json")), "the font cache is kept in devprof's folder"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("matplotlib-")] == []  # none of matplotlib's own


def test_a_writable_default_or_a_chosen_folder_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("MPLCONFIGDIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delitem(sys.modules, "matplotlib", raising=False)
    mpl_config.ensure_config_dir()
    assert "MPLCONFIGDIR" not in os.environ
    monkeypatch.setenv("XDG_CONFIG_HOME", "/proc/self/none")
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "chosen"))
    mpl_config.ensure_config_dir()
    assert os.environ["MPLCONFIGDIR"] == str(tmp_path / "chosen")


def test_devprofs_folder_is_refused_where_a_link_or_another_user_holds_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(mpl_config.tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    name = tmp_path / f"devprof-matplotlib-{os.getuid()}"
    assert mpl_config.own_config_dir() == name and (name.stat().st_mode & 0o777) == 0o700
    name.rmdir()
    name.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    assert mpl_config.own_config_dir() is None
    name.unlink()
    if os.getuid() == 0:  # only root can give a folder away
        name.mkdir()
        os.chown(name, 12345, -1)
        assert mpl_config.own_config_dir() is None
