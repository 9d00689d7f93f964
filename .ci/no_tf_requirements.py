"""Print devprof's requirements without TensorFlow, one a line, for `pip install -r`.

The fast tier (`pytest -m "not slow"`) needs no TensorFlow; .ci/run runs it once in an
environment made from these lines and `pip install --no-deps -e .`, so that a fast test that
reaches for TensorFlow fails there. The lines are pyproject.toml's own, so the two environments
cannot drift apart: its dependencies less TensorFlow, and the `test` extra.
"""

import re
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: the same parser, as pip vendors it
    from pip._vendor import tomli as tomllib

WITHOUT = {"tensorflow"}  # the `gpu` extra (TensorFlow's CUDA wheels) is not read at all


def requirements(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    lines = []
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")
        if name not in WITHOUT and requirement not in lines:
            lines.append(requirement)
    return lines


if __name__ == "__main__":
    print("\n".join(requirements(Path(__file__).resolve().parents[1] / "pyproject.toml")))
