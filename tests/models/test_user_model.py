"""`--model FILE:FUNCTION` and `--dataset` specs that name no Python file: said so, before anything runs."""

from __future__ import annotations

import pytest


def test_a_model_spec_naming_a_text_file_says_it_is_no_python_file(tmp_path, monkeypatch):
    """`--model notes.txt:build` said: no module named 'notes' here."""
    from models.user_model import ModelError, load_function

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("def build(): pass\n")
    with pytest.raises(ModelError, match=r"notes\.txt is not a Python file \(\.py\)"):
        load_function("notes.txt:build", "--model")


def test_a_model_file_spec_naming_a_folder_says_so(tmp_path):
    from models.user_model import ModelError, load_function

    (tmp_path / "pkg.py").mkdir()
    with pytest.raises(ModelError, match=r"pkg\.py is a folder, not a Python file"):
        load_function(f"{tmp_path / 'pkg.py'}:build", "--model")
