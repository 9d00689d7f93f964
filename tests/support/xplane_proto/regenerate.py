"""Regenerate the test suite's XSpace module (`xplane_pb2.py` and its `.pyi` stub) from the
`xplane.proto` beside this script; with --from-tensorflow, first rebuild that `.proto` from the
schema compiled into an installed TensorFlow.

    python -m venv /tmp/protoc && /tmp/protoc/bin/pip install grpcio-tools==1.74.0
    /tmp/protoc/bin/python tests/support/xplane_proto/regenerate.py          # from the repository root
    /tmp/protoc/bin/python tests/support/xplane_proto/regenerate.py --check  # fails if they are stale
    /tmp/protoc/bin/python tests/support/xplane_proto/regenerate.py --from-tensorflow .venv/lib/python3.11/site-packages/tensorflow

TensorFlow's wheel ships the schema only compiled, as `tsl/profiler/protobuf/xplane_pb2.py`; the
serialized FileDescriptorProto inside it is printed back as `.proto` text. The file keeps
TensorFlow's name (`tsl/profiler/protobuf/xplane.proto`) and package (`tensorflow.profiler`), so
the descriptor protoc makes from it is byte for byte TensorFlow's: the messages are the same on
the wire, and both modules load in one process (protobuf's default pool takes an identical file
twice). --from-tensorflow checks that identity before writing anything.

grpcio-tools 1.74.0 bundles protoc 31.1, as for analysis/read/xla_proto/regenerate.py: the
modules then need protobuf>=6.31.1, which pyproject.toml asks for.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PROTO = HERE / "xplane.proto"
UPSTREAM_NAME = "tsl/profiler/protobuf/xplane.proto"  # the name TensorFlow registers it under
PROTOC_VERSION = "31.1"
GRPCIO_TOOLS = "grpcio-tools==1.74.0"
_SOURCE = re.compile(r"tensorflow==(\S+),\s*(?://\s*)?(\S+)")
_SERIALIZED = re.compile(r"AddSerializedFile\((b'(?:[^'\\]|\\.)*')\)")


def serialized_descriptor(pb2_text: str) -> bytes:
    """The serialized FileDescriptorProto that a generated `*_pb2.py` registers, read from its text."""
    found = _SERIALIZED.search(pb2_text)
    if found is None:
        raise SystemExit("no AddSerializedFile(b'...') in the generated module")
    return ast.literal_eval(found.group(1))


def _header(proto: Path) -> str:
    version, path = _SOURCE.search(proto.read_text(encoding="utf-8")).groups()  # type: ignore[union-attr]
    return (
        f"# Generated from xplane.proto by tests/support/xplane_proto/regenerate.py (protoc {PROTOC_VERSION}): do not edit.\n"
        f"# Its schema is TensorFlow's {UPSTREAM_NAME}, as compiled into tensorflow=={version} ({path}).\n"
        "# Copyright 2019 The TensorFlow Authors. Licensed under the Apache License, Version 2.0\n"
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


def generate(proto: Path, out: Path) -> dict[str, str]:
    """The generated module and stub by file name, made under `out` (a scratch folder)."""
    version = _protoc("--version").split()[-1]
    if version != PROTOC_VERSION:
        raise SystemExit(f"protoc {version} found, {PROTOC_VERSION} wanted: pip install {GRPCIO_TOOLS}")
    # Compiled under TensorFlow's own name, so the descriptor is TensorFlow's byte for byte.
    source = out / "src"
    (source / UPSTREAM_NAME).parent.mkdir(parents=True)
    shutil.copyfile(proto, source / UPSTREAM_NAME)
    _protoc(f"-I{source}", f"--python_out={out}", f"--pyi_out={out}", str(source / UPSTREAM_NAME))
    made = out / Path(UPSTREAM_NAME).parent
    return {
        file: _header(proto) + (made / file).read_text(encoding="utf-8") for file in ("xplane_pb2.py", "xplane_pb2.pyi")
    }


# --from-tensorflow: FileDescriptorProto -> .proto text (the subset of proto3 this file uses).

_TYPES = {
    1: "double",
    2: "float",
    3: "int64",
    4: "uint64",
    5: "int32",
    6: "fixed64",
    7: "fixed32",
    8: "bool",
    9: "string",
    12: "bytes",
    13: "uint32",
    15: "sfixed32",
    16: "sfixed64",
    17: "sint32",
    18: "sint64",
}
_REPEATED, _MESSAGE = 3, 11


def _type_name(field, package: str) -> str:
    if field.type != _MESSAGE:
        return _TYPES[field.type]
    return field.type_name.removeprefix(f".{package}.")


def _message_text(message, package: str, indent: str) -> list[str]:
    if message.enum_type or message.extension or message.options.ByteSize():
        raise SystemExit(f"{message.name}: enums, extensions and message options are not printed here")
    lines = [f"{indent}message {message.name} {{"]
    inner = indent + "  "
    maps = {
        f".{package}.{message.name}.{nested.name}": nested for nested in message.nested_type if nested.options.map_entry
    }
    for nested in message.nested_type:
        if not nested.options.map_entry:
            lines += _message_text(nested, package, inner)
    if message.reserved_range:
        numbers = [
            str(r.start) if r.end == r.start + 1 else f"{r.start} to {r.end - 1}" for r in message.reserved_range
        ]
        lines.append(f"{inner}reserved {', '.join(numbers)};")
    if message.reserved_name:
        lines.append(f"{inner}reserved {', '.join(repr(name) for name in message.reserved_name)};")
    open_oneof = None
    for field in message.field:
        if field.options.ByteSize() or field.HasField("default_value") or field.proto3_optional:
            raise SystemExit(f"{message.name}.{field.name}: field options, defaults and optional are not printed here")
        oneof = field.oneof_index if field.HasField("oneof_index") else None
        if oneof != open_oneof:
            if open_oneof is not None:
                lines.append(f"{inner}}}")
            if oneof is not None:
                lines.append(f"{inner}oneof {message.oneof_decl[oneof].name} {{")
            open_oneof = oneof
        at = inner + ("  " if oneof is not None else "")
        if field.type_name in maps:
            key, value = maps[field.type_name].field
            kinds = f"{_type_name(key, package)}, {_type_name(value, package)}"
            lines.append(f"{at}map<{kinds}> {field.name} = {field.number};")
        else:
            label = "repeated " if field.label == _REPEATED else ""
            lines.append(f"{at}{label}{_type_name(field, package)} {field.name} = {field.number};")
    if open_oneof is not None:
        lines.append(f"{inner}}}")
    lines.append(f"{indent}}}")
    return lines


def proto_text(serialized: bytes, version: str, path: str) -> str:
    """`.proto` text whose descriptor, compiled by protoc, is `serialized` again (checked by the caller)."""
    from google.protobuf import descriptor_pb2

    file = descriptor_pb2.FileDescriptorProto.FromString(serialized)
    if file.name != UPSTREAM_NAME or file.syntax != "proto3" or file.dependency or file.enum_type or file.service:
        raise SystemExit(f"{file.name}: not the self-contained proto3 file this script prints")
    options = descriptor_pb2.FileOptions(cc_enable_arenas=True)
    if file.options != options:
        raise SystemExit(f"{file.name}: file options {file.options} are not the ones printed here")
    lines = [
        "// XSpace, the profiler's trace format (`.xplane.pb`), for the test suite: TensorFlow's",
        f"// {UPSTREAM_NAME} (upstream: openxla/xla, xla/{UPSTREAM_NAME}),",
        f"// printed from its descriptor as compiled into tensorflow=={version},",
        f"// {path}",
        "// (TensorFlow's wheel ships no .proto text, so upstream's comments are not here).",
        "// Copyright 2019 The TensorFlow Authors.",
        '// Licensed under the Apache License, Version 2.0 (the "License"); you may not use this file',
        "// except in compliance with the License. You may obtain a copy of the License at",
        "//     http://www.apache.org/licenses/LICENSE-2.0",
        "// Unless required by applicable law or agreed to in writing, software distributed under the",
        '// License is distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND,',
        "// either express or implied. See the License for the specific language governing permissions",
        "// and limitations under the License.",
        "//",
        "// Whole and unchanged: same messages, fields, numbers, package and file name, so the descriptor",
        "// protoc makes from it is TensorFlow's byte for byte (tests/support/xplane_proto/regenerate.py checks",
        "// it, and so does a slow test where TensorFlow is installed).",
        "//",
        "// Python module: python tests/support/xplane_proto/regenerate.py",
        "",
        f'syntax = "{file.syntax}";',
        "",
        f"package {file.package};",
        "",
        "option cc_enable_arenas = true;",
    ]
    for message in file.message_type:
        lines += ["", *_message_text(message, file.package, "")]
    return "\n".join(lines) + "\n"


def from_tensorflow(package: Path) -> str:
    """xplane.proto's text from the TensorFlow installed at `package` (its `tensorflow/` folder)."""
    pb2 = package / "tsl" / "profiler" / "protobuf" / "xplane_pb2.py"
    if not pb2.exists():
        raise SystemExit(f"{pb2} is missing: give the tensorflow/ folder of an installed TensorFlow")
    versions = sorted(
        info.name.removesuffix(".dist-info").split("-")[1] for info in package.parent.glob("tensorflow-*.dist-info")
    )
    if len(versions) != 1:
        raise SystemExit(f"cannot tell which TensorFlow is installed at {package}: {versions or 'no dist-info'}")
    serialized = serialized_descriptor(pb2.read_text(encoding="utf-8"))
    text = proto_text(serialized, versions[0], "tensorflow/tsl/profiler/protobuf/xplane_pb2.py")
    with tempfile.TemporaryDirectory() as scratch:
        candidate = Path(scratch) / "xplane.proto"
        candidate.write_text(text, encoding="utf-8")
        made = generate(candidate, Path(scratch) / "out")
    if serialized_descriptor(made["xplane_pb2.py"]) != serialized:
        raise SystemExit("the printed xplane.proto does not compile to TensorFlow's descriptor: not written")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the checked-in files")
    parser.add_argument(
        "--from-tensorflow",
        type=Path,
        metavar="TENSORFLOW_DIR",
        help="first print xplane.proto from this installed TensorFlow (its tensorflow/ folder)",
    )
    args = parser.parse_args(argv)
    texts = {}
    if args.from_tensorflow:
        texts[PROTO.name] = from_tensorflow(args.from_tensorflow.resolve())
    with tempfile.TemporaryDirectory() as scratch:
        proto = PROTO
        if PROTO.name in texts:
            proto = Path(scratch) / PROTO.name
            proto.write_text(texts[PROTO.name], encoding="utf-8")
        texts.update(generate(proto, Path(scratch) / "out"))
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
        print(f"stale: {', '.join(stale)}: run python tests/support/xplane_proto/regenerate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
