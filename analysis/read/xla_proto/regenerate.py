"""Regenerate the Python modules of XLA's HLO schema (`hlo_pb2.py`, `xla_data_pb2.py` and their
`.pyi` stubs) from the `.proto` files beside this script.

    python -m venv /tmp/protoc && /tmp/protoc/bin/pip install grpcio-tools==1.74.0
    /tmp/protoc/bin/python -m analysis.read.xla_proto.regenerate          # from the repository root
    /tmp/protoc/bin/python -m analysis.read.xla_proto.regenerate --check  # fails if they are stale

grpcio-tools 1.74.0 bundles protoc 31.1, which writes code for protobuf 6.31.1; the modules refuse
an older protobuf runtime when imported, which is why pyproject.toml asks for protobuf>=6.31.1.
A separate environment keeps grpcio-tools' own protobuf pin out of devprof's. Another protoc is
refused: the modules would change, and so would the runtime they need.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PROTOS = ("xla_data.proto", "hlo.proto")  # imported before importer
PROTOC_VERSION = "31.1"
GRPCIO_TOOLS = "grpcio-tools==1.74.0"
_COMMIT = re.compile(r"openxla/xla, (\S+) at commit\s*(?://\s*)?([0-9a-f]{40})")


def _header(proto: Path) -> str:
    path, commit = _COMMIT.search(proto.read_text(encoding="utf-8")).groups()  # type: ignore[union-attr]
    return (
        f"# Generated from {proto.name} by analysis/read/xla_proto/regenerate.py (protoc {PROTOC_VERSION}): "
        "do not edit.\n"
        f"# Its schema is a wire-compatible part of XLA's {path} at openxla/xla commit {commit}.\n"
        "# Copyright 2017 The OpenXLA Authors. Licensed under the Apache License, Version 2.0\n"
        '# (http://www.apache.org/licenses/LICENSE-2.0), distributed on an "AS IS" BASIS, WITHOUT\n'
        "# WARRANTIES OR CONDITIONS OF ANY KIND.\n"
    )


def _protoc(*args: str) -> str:
    try:
        done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", *args], capture_output=True, text=True)
    except OSError as exc:
        raise SystemExit(f"cannot run protoc: {exc}") from None
    if done.returncode != 0:
        if "No module named grpc_tools" in done.stderr:
            raise SystemExit(f"grpc_tools is not installed here: pip install {GRPCIO_TOOLS} (in a separate venv)")
        raise SystemExit(f"protoc failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def generate(out: Path) -> dict[str, str]:
    """The generated modules' texts by file name, written under `out` (a scratch folder)."""
    version = _protoc("--version").split()[-1]
    if version != PROTOC_VERSION:
        raise SystemExit(f"protoc {version} found, {PROTOC_VERSION} wanted: pip install {GRPCIO_TOOLS}")
    # Paths relative to the repository root: the modules then import each other as analysis.read.xla_proto.*
    _protoc(f"-I{ROOT}", f"--python_out={out}", f"--pyi_out={out}", *(str(HERE / name) for name in PROTOS))
    made = out / HERE.relative_to(ROOT)
    texts = {}
    for name in PROTOS:
        stem = Path(name).stem
        for suffix in (".py", ".pyi"):
            file = f"{stem}_pb2{suffix}"
            texts[file] = _header(HERE / name) + (made / file).read_text(encoding="utf-8")
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the checked-in modules")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        texts = generate(Path(scratch))
    stale = []
    for file, text in texts.items():
        target = HERE / file
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current == text:
            continue
        if args.check:
            stale.append(file)
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True), file, file))
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(ROOT)}")
    if stale:
        print(f"stale: {', '.join(stale)}: run python -m analysis.read.xla_proto.regenerate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
