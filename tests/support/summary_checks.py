"""The agents' summary (`devprof.summary/1`) checked against its JSON Schema in docs/."""

from __future__ import annotations

import json

import jsonschema

from analysis.render import summary
from repo_paths import REPO

SCHEMA = json.loads((REPO / "docs" / "summary.schema.json").read_text())


def check(document: dict) -> None:
    """Valid against the schema, every key documented there and every documented key present."""
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator(SCHEMA).validate(document)
    _same_keys(document, SCHEMA, "summary")


def _same_keys(value, schema: dict, where: str) -> None:
    if "$ref" in schema:
        schema = SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    if isinstance(value, dict) and "properties" in schema:
        assert set(value) == set(schema["properties"]) == set(schema["required"]), where
        for key, item in value.items():
            _same_keys(item, schema["properties"][key], f"{where}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _same_keys(item, schema["items"], f"{where}[]")


def rendered(result) -> dict:
    text = result.render("summary")
    assert text.endswith("\n") and text.count("\n") == 1  # one line
    assert len(text.encode("utf-8")) <= summary.MAX_BYTES
    document = json.loads(text)
    check(document)
    return document
