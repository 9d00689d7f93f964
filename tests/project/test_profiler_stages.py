"""profiler/'s stage folders in their order: a module imports only its own stage and the stages
below it, never a package that holds it, and models/ imports neither profiler/ nor analysis/.
Read from the source with `ast` (lazy imports inside functions count too), so it needs no
TensorFlow and finds an import that runs back up before anything runs it."""

from __future__ import annotations

import ast
from pathlib import Path

from repo_paths import REPO

# Lowest first. A module belongs to the longest prefix naming it; the top level (`profiler`:
# the public API and `python -m profiler`) sits above every stage.
STAGES = (
    ("profiler.samplers",),
    ("profiler.device",),
    ("profiler.roofline",),
    ("profiler.record",),
    ("profiler.train",),
    (
        "profiler.cli.common",
        "profiler.cli.launcher",
        "profiler.cli.tensorboard_server",
        "profiler.cli.mcp_server",
        "profiler.cli.tune",
    ),
    ("profiler.cli.commands",),
    ("profiler.cli",),
    ("profiler",),
)
TOP_LEVEL = {"__init__", "__main__", "api", "keras_callback"}  # only what users import or run


def modules_of(root: Path, package: str) -> dict[str, Path]:
    found = {}
    for path in (root / package).rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules `module` imports, each named as the module it loads (`from p import m` names p.m
    where that is a module, else p)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return found


def stage_of(module: str, stages=STAGES) -> int:
    best = max(
        (
            (len(prefix), index)
            for index, names in enumerate(stages)
            for prefix in names
            if module == prefix or module.startswith(prefix + ".")
        ),
        default=None,
    )
    assert best is not None, f"{module} is in no stage"
    return best[1]


def back_up_imports(root: Path, stages=STAGES) -> list[str]:
    """Every import in profiler/ that runs back up: to a higher stage, or to a package holding the module."""
    modules = modules_of(root, "profiler")
    problems = []
    for module, path in sorted(modules.items()):
        for target in sorted(imports_of(module, path, set(modules)) & set(modules)):
            if module.startswith(target + ".") and module != f"{target}.__main__":  # `python -m` runs its package
                problems.append(f"{module} imports {target}, a package that holds it")
            elif stage_of(target, stages) > stage_of(module, stages):
                problems.append(f"{module} imports {target}, a higher stage")
    return problems


def test_no_import_runs_back_up():
    assert back_up_imports(REPO) == []


def test_every_folder_is_a_stage_and_the_top_level_is_the_public_api():
    named = {prefix for names in STAGES for prefix in names}
    folders = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "profiler").rglob("__init__.py")}
    assert folders - {"profiler"} <= named, folders - named
    assert {p.stem for p in (REPO / "profiler").glob("*.py")} == TOP_LEVEL


def test_models_import_neither_profiler_nor_analysis():
    modules = modules_of(REPO, "models")
    for module, path in modules.items():
        outside = {m for m in imports_of(module, path, set(modules)) if m.split(".")[0] in ("profiler", "analysis")}
        assert not outside, f"{module} imports {outside}"


def test_the_check_finds_an_import_that_runs_back_up(tmp_path):
    for folder in ("profiler", "profiler/record", "profiler/cli", "profiler/cli/commands"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "profiler" / "record" / "session.py").write_text("def f():\n    from profiler.cli import launcher\n")
    (tmp_path / "profiler" / "cli" / "launcher.py").write_text("from profiler.record import session\n")
    (tmp_path / "profiler" / "cli" / "commands" / "run.py").write_text("from profiler import cli\n")
    assert back_up_imports(tmp_path) == [
        "profiler.cli.commands.run imports profiler.cli, a package that holds it",
        "profiler.record.session imports profiler.cli.launcher, a higher stage",
    ]
    (tmp_path / "profiler" / "record" / "rundir.py").write_text("")
    (tmp_path / "profiler" / "record" / "session.py").write_text("from profiler.record import rundir\n")
    (tmp_path / "profiler" / "cli" / "commands" / "run.py").write_text("from profiler.cli import launcher\n")
    assert back_up_imports(tmp_path) == []


def test_no_two_modules_of_the_profiler_import_each_other():
    """An import circle (`profiler/train/hooks.py` <-> `profiler/train/run.py`, once only for typing) makes which
    module loads first matter; `hooks` now names what it needs as a Protocol."""
    import ast

    root = REPO
    modules = {}
    for path in (root / "profiler").rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("profiler"):
                imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names if alias.name.startswith("profiler")}
        modules[name] = imported - {name}
    circles = {
        tuple(sorted((a, b)))
        for a, imported in modules.items()
        for b in imported
        if b in modules and a in modules[b] and not (a.startswith(b + ".") or b.startswith(a + "."))
    }
    assert not circles, circles
