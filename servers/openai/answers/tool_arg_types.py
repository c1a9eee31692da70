"""A tool call's string argument values converted to the types its JSON schema names, by vLLM 0.32's rules."""

from __future__ import annotations

import json
import math
from typing import Any

# the type names vLLM reads as JSON schema types (lower-cased first)
TYPE_ALIASES = {
    "str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
    "int": "integer", "int32": "integer", "int64": "integer", "uint": "integer", "uint32": "integer",
    "uint64": "integer", "long": "integer", "short": "integer", "unsigned": "integer",
    "float": "number", "float32": "number", "float64": "number", "double": "number",
    "bool": "boolean", "dict": "object", "arr": "array", "list": "array", "sequence": "array",
}
PRIORITY = ("null", "integer", "number", "boolean", "object", "array", "string")
_ENUM_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
               (dict, "object"))


def schema_types(schema: Any) -> set[str]:
    """The types a schema allows: `type` (one or a list), its enum values' types, anyOf/oneOf/allOf; else string."""
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    named = schema.get("type")
    types.update([named] if isinstance(named, str) else [t for t in named if isinstance(t, str)]
                 if isinstance(named, list) else [])
    enum = schema.get("enum")
    for value in enum if isinstance(enum, list) else []:
        kind = "null" if value is None else next((n for t, n in _ENUM_TYPES if isinstance(value, t)), None)
        types.update([kind] if kind else [])
    for key in ("anyOf", "oneOf", "allOf"):
        for choice in schema.get(key) if isinstance(schema.get(key), list) else []:
            types |= schema_types(choice)
    return types or {"string"}


def _finite(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (ValueError, TypeError):
        return False


def _as_type(value: str, kind: str) -> tuple[bool, Any]:
    """(True, the value as `kind`) or (False, None) when it does not read as one."""
    try:
        if kind == "null":
            return value.lower() == "null", None
        if kind == "integer":
            return True, int(value)
        if kind == "number":
            number = float(value)
            if not math.isfinite(number):
                return False, None
            return True, number if number != int(number) else int(number)
    except ValueError:
        return False, None
    if kind == "boolean":
        word = value.lower().strip()
        return word in ("true", "1", "false", "0"), word in ("true", "1")
    try:
        parsed = json.loads(value)  # object or array: any JSON that loads, as vLLM takes it
    except ValueError:
        return False, None
    return _finite(parsed), parsed


def coerce(value: str, types: set[str]) -> Any:
    """The value as the first of the types (null, integer, number, boolean, object, array, string) it reads as;
    when none does, what it loads as JSON, else the string."""
    wanted = {TYPE_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in types}
    for kind in PRIORITY:
        if kind == "string" and kind in wanted:
            return value
        if kind in wanted and (hit := _as_type(value, kind))[0]:
            return hit[1]
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value


def coerce_value(value: Any, schema: dict[str, Any]) -> tuple[Any, bool]:
    """(value as its schema types it, whether that changed it): strings converted, objects and arrays walked
    where the schema has properties or items, other values re-read through their JSON text."""
    if isinstance(value, str):
        converted = coerce(value, schema_types(schema))
        return converted, converted is not value
    if isinstance(value, dict):
        props = schema.get("properties")
        return value, isinstance(props, dict) and coerce_fields(value, props)
    if isinstance(value, list):
        items, changed = schema.get("items"), False
        for i, item in enumerate(value if isinstance(schema.get("items"), dict) else []):
            value[i], item_changed = coerce_value(item, items)
            changed = changed or item_changed
        return value, changed
    converted = coerce(json.dumps(value, ensure_ascii=False), schema_types(schema))
    return converted, type(converted) is not type(value) or converted != value


def coerce_fields(args: dict[str, Any], properties: dict[str, Any]) -> bool:
    """Converts args' values in place by their properties' schemas; whether any changed."""
    changed = False
    for key, value in args.items():
        if isinstance(properties.get(key), dict):
            args[key], value_changed = coerce_value(value, properties[key])
            changed = changed or value_changed
    return changed


def typed_arguments(arguments: str, properties: dict[str, Any]) -> str:
    """A call's arguments JSON with its values typed by the tool's properties; unchanged when it is not a JSON
    object, the tool has no properties, or nothing changed (vLLM's `_fix_arg_types`)."""
    if not properties:
        return arguments
    try:
        args = json.loads(arguments)
    except ValueError:
        return arguments
    if not isinstance(args, dict) or not coerce_fields(args, properties):
        return arguments
    return json.dumps(args, ensure_ascii=False)
