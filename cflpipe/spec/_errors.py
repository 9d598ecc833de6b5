"""Validation errors as the lines a user reads: `yaml.path: what is wrong, got VALUE`, the path
as it stands in the YAML file, and for an unknown key the keys allowed there."""

from __future__ import annotations

from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, ValidationError


_MESSAGES = {
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "missing": "is required",
    "extra_forbidden": "unknown key",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "too_short": "must have at least {min_length} entries",
    "string_too_short": "must not be empty",
    "string_too_long": "must have at most {max_length} characters",
    "literal_error": "must be one of {expected}",
    "union_tag_invalid": "must be one of {expected_tags}",  # path gets the tag key appended
    "union_tag_not_found": "needs a `{discriminator}` key",
}


def _yaml_path(loc: tuple, data: Any) -> str:
    """Turn a pydantic location into the path a user sees in the YAML file, dropping the
    internal steps (union tags, validator names) that have no counterpart in the input."""
    parts: list[str] = []
    node = data
    for position, key in enumerate(loc):
        last = position == len(loc) - 1
        if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            parts.append(f"[{key}]")
            node = node[key]
        elif isinstance(node, dict) and key in node:
            parts.append(f".{key}" if parts else str(key))
            node = node[key]
        elif last and isinstance(key, str) and isinstance(node, dict):
            parts.append(f".{key}" if parts else str(key))
            node = None
        elif isinstance(node, (dict, list)) or node is None:
            continue  # an internal step such as a union tag
    return "".join(parts) or "spec"


def _format_error(error: dict, data: Any, prefix: str = "") -> str:
    path = _yaml_path(tuple(error["loc"]), data)
    if prefix:
        path = prefix if path == "spec" else f"{prefix}.{path}" if not path.startswith("[") else prefix + path
    kind = error["type"]
    ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v
           for k, v in (error.get("ctx") or {}).items()}
    if kind == "value_error":
        message = str(ctx.get("error", error["msg"]))
        if message.startswith("@"):  # a rule across a model's fields names the key it blames: "@key.sub: …"
            key, _, message = message[1:].partition(": ")
            path = key if path == "spec" else f"{path}.{key}"
        return f"{path}: {message}"
    if kind == "too_short" and ctx.get("min_length") == 1:
        message = "must not be empty"
    elif kind in _MESSAGES:
        try:
            message = _MESSAGES[kind].format(**ctx)
        except (KeyError, IndexError):
            message = error["msg"]
    else:
        message = error["msg"][0].lower() + error["msg"][1:]
    if kind == "missing":
        return f"{path}: {message}"
    if kind == "union_tag_invalid":
        return f"{path}.{ctx.get('discriminator', 'kind').strip(chr(39))}: {message}, got {_short(ctx.get('tag'))}"
    value = error.get("input")
    return f"{path}: {message}, got {_short(value)}"


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
    if text.endswith("\n..."):
        text = text[:-4]
    text = text.removesuffix("...").strip()
    return text if len(text) <= 60 else text[:57] + "..."


def errors_to_lines(exc: ValidationError, data: Any, prefix: str = "", model: type[BaseModel] | None = None
                    ) -> list[str]:
    """One line per error; with the validated `model`, an unknown key's line lists the allowed keys."""
    lines = []
    for err in exc.errors():
        line = _format_error(err, data, prefix)
        if err["type"] == "extra_forbidden" and model is not None:
            allowed = _keys_at(model, tuple(err["loc"])[:-1])
            if allowed:
                line += f"; allowed: {', '.join(allowed)}"
        lines.append(line)
    return lines


def _keys_at(annotation: Any, loc: tuple) -> list[str] | None:
    """The field names of the model reached by following `loc` from `annotation` (through
    models, dicts, lists and tagged unions), or None when the path leads elsewhere."""
    from typing import get_args, get_origin

    def unwrap(node: Any) -> list[Any]:
        origin = get_origin(node)
        if origin is Annotated:
            return unwrap(get_args(node)[0])
        if origin is Union or type(node).__name__ == "UnionType":
            return [member for arg in get_args(node) for member in unwrap(arg)]
        return [node]

    nodes = unwrap(annotation)
    for part in loc:
        following = []
        for node in nodes:
            origin = get_origin(node)
            if isinstance(node, type) and issubclass(node, BaseModel) and part in node.model_fields:
                following += unwrap(node.model_fields[part].annotation)
            elif origin is dict:
                following += unwrap(get_args(node)[1])
            elif origin is list and isinstance(part, int):
                following += unwrap(get_args(node)[0])
        # A tagged union reports the tag as a path part: keep the member whose `kind` it is.
        tagged = [n for n in nodes if isinstance(n, type) and issubclass(n, BaseModel) and "kind" in n.model_fields
                  and get_args(n.model_fields["kind"].annotation) == (part,)]
        nodes = tagged or following
        if not nodes:
            return None
    models = [n for n in nodes if isinstance(n, type) and issubclass(n, BaseModel)]
    return list(models[0].model_fields) if len(models) == 1 else None
