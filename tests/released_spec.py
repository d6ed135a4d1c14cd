"""The released server's API (``tests/data/specs/opensandbox-server-1.1.1-openapi.json``) as a
checker of the requests our client sends: route, query parameters and JSON body.

A small structural check, not a full JSON Schema validator: ``$ref``, ``anyOf``, objects
(no property the schema does not name, every required one present), arrays, strings with
``minLength``/``enum``/``pattern``, integers with bounds, booleans and nulls.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

SPEC_FILE = Path(__file__).parent / "data" / "specs" / "opensandbox-server-1.1.1-openapi.json"


@lru_cache(maxsize=1)
def spec() -> dict[str, Any]:
    return json.loads(SPEC_FILE.read_text())


def _route(method: str, path: str) -> tuple[str, dict[str, Any]]:
    """The spec's template and operation for a concrete path, or AssertionError."""
    for template, operations in spec()["paths"].items():
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path) and method.lower() in operations:
            return template, operations[method.lower()]
    raise AssertionError(f"{method} {path} is not a route of the released server")


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = spec()["components"]["schemas"][name]
    return schema


def problems(value: Any, schema: dict[str, Any], where: str = "body") -> list[str]:
    """What is wrong with ``value`` against ``schema`` (empty: it fits)."""
    schema = _resolve(schema)
    if "anyOf" in schema:
        found = [problems(value, option, where) for option in schema["anyOf"]]
        return [] if any(not p for p in found) else min(found, key=len)
    kind = schema.get("type")
    if not kind:
        return []  # the spec says nothing more ({} schemas)
    checks = {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "integer": type(value) is int,
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "null": value is None,
    }
    if not checks.get(kind, True):
        return [f"{where}: {value!r} is not {kind}"]
    found: list[str] = []
    if kind == "object":
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key in schema.get("required", ()):
            if key not in value:
                found.append(f"{where}: lacks the required {key!r}")
        for key, item in value.items():
            if key in properties:
                found += problems(item, properties[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                found += problems(item, extra, f"{where}.{key}")
            elif properties and extra is not True:
                found.append(f"{where}: {key!r} is not a field of the released API")
    elif kind == "array":
        for index, item in enumerate(value):
            found += problems(item, schema.get("items", {}), f"{where}[{index}]")
        if len(value) < schema.get("minItems", 0):
            found.append(f"{where}: fewer than {schema['minItems']} items")
    elif kind == "string":
        if len(value) < schema.get("minLength", 0):
            found.append(f"{where}: shorter than {schema['minLength']}")
        if "enum" in schema and value not in schema["enum"]:
            found.append(f"{where}: {value!r} not in {schema['enum']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            found.append(f"{where}: {value!r} does not match {schema['pattern']}")
    elif kind == "integer":
        if "minimum" in schema and value < schema["minimum"]:
            found.append(f"{where}: {value} below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            found.append(f"{where}: {value} above {schema['maximum']}")
    return found


def check_request(request: Any, base: str = "http://osb.test") -> str:
    """Assert that a sent request is one the released server takes; returns its template.

    ``request`` is a ``requests.PreparedRequest`` (``responses``' ``call.request``).
    """
    url = urlsplit(request.url)
    template, operation = _route(request.method, url.path)
    declared = {p["name"]: p for p in operation.get("parameters", ()) if p["in"] == "query"}
    for name, values in parse_qs(url.query, keep_blank_values=True).items():
        assert name in declared, f"{template}: query {name!r} is not a parameter"
        schema = _resolve(declared[name]["schema"])
        if len(values) > 1:
            assert "array" in json.dumps(schema), f"{template}: {name!r} repeated"
    for name, parameter in declared.items():
        if parameter.get("required"):
            assert name in parse_qs(url.query), f"{template}: lacks the query {name!r}"
    body_spec = operation.get("requestBody")
    if request.body:
        assert body_spec, f"{template} takes no body"
        schema = body_spec["content"]["application/json"]["schema"]
        body = json.loads(request.body)
        found = problems(body, schema)
        assert not found, f"{request.method} {template}: {found}"
    else:
        assert not (body_spec or {}).get("required"), f"{template} needs a body"
    return f"{request.method} {template}"
