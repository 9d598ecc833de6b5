"""Spec files: reading them (YAML 1.2's duplicate keys and floats, size and encoding limits),
where a spec file without `results_dir` writes, and writing YAML."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from cflpipe.errors import SpecError
from cflpipe.spec._checks import parse_spec
from cflpipe.spec._spec import Spec

# A spec is a short text file; beyond this it is some other file given by mistake.
MAX_SPEC_BYTES = 1 << 20


class DuplicateKeyError(yaml.YAMLError):
    pass


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader with two YAML 1.2 behaviours: a key repeated in one mapping is an
    error (PyYAML keeps the last value, so a second `methods:` block would silently replace the
    first), and `1e-3` is a number (YAML 1.1, which PyYAML follows, reads it as a string)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            # The mapping's own keys only: keys merged in with `<<` may be overridden here.
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    if key in first:
                        raise DuplicateKeyError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                                                f"(first at line {first[key]}); each key may appear once")
                    first[key] = key_node.start_mark.line + 1
                except TypeError:
                    pass  # an unhashable key: the base class reports it
        return super().construct_mapping(node, deep=deep)


UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def read_yaml(path: str | Path) -> Any:
    """A YAML file as the spec loader reads it (for tools that read a spec themselves)."""
    return yaml.load(Path(path).read_text(), Loader=UniqueKeyLoader)


def apply_overrides(data: Any, overrides: list[str]) -> Any:
    """The spec's data with each `KEY=VALUE` of `overrides` set, in order: KEY a dotted path into the
    spec (`training.rounds`, `scenarios.digits-swap4.clients`; mappings missing on the way are
    created), VALUE a YAML value (`5`, `[0, 1]`, `{kind: iid}`). What the result means is checked
    as the spec is (parse_spec), so a wrong key or value gets the spec's own line with its path."""
    if not overrides:
        return data
    if not isinstance(data, dict):
        return data  # parse_spec says what the file is instead of a mapping
    data = copy.deepcopy(data)  # YAML anchors may share or nest objects; the file's data stays as read
    for item in overrides:
        key, eq, text = item.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts):
            raise SpecError(f"--set: {item!r} is not KEY=VALUE; allowed: a dotted key into the spec, '=' and a "
                            f"YAML value, e.g. training.rounds=5 or seeds=[0,1]")
        try:
            value = yaml.load(text, Loader=UniqueKeyLoader) if text.strip() else None
        except yaml.YAMLError as exc:
            raise SpecError(f"--set {key}: {text!r} is not a YAML value ({getattr(exc, 'problem', None) or exc})") \
                from None
        node = data
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SpecError(f"--set {key}: {'.'.join(parts[:depth + 1])} is {child!r} in the spec, not a "
                                f"mapping; set it whole ({'.'.join(parts[:depth + 1])}=...)")
            node = child
        node[parts[-1]] = value
    return data


def spec_data(path: str | Path, overrides: list[str] | None = None) -> Any:
    """A spec file's data as load_spec parses it: read, `results_dir` defaulted from the file's
    name, and `overrides` (KEY=VALUE, apply_overrides) set."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"--config: {str(path)!r} is a folder; give the spec's YAML file")
    if not path.is_file():
        raise SpecError(f"--config: file {str(path)!r} does not exist")
    size = path.stat().st_size
    if size > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: {size} bytes; a spec is at most {MAX_SPEC_BYTES} bytes (1 MiB)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                        f"a spec is a YAML text file") from None
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)
    except DuplicateKeyError as exc:
        raise SpecError(f"{path}: {exc}") from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply to be a spec") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise SpecError(f"{path}: {problem}{where}") from None
    if isinstance(data, dict) and "results_dir" not in data:
        data = {**data, "results_dir": default_results_dir(path)}
    return apply_overrides(data, overrides or [])


def load_spec(path: str | Path, overrides: list[str] | None = None, **kwargs: Any) -> Spec:
    """The spec of a YAML file, with `overrides` (`KEY=VALUE`, apply_overrides) set before it is
    checked; its runs record what they ran (config.yaml), overrides included."""
    spec = parse_spec(spec_data(path, overrides), **kwargs)
    spec._source = str(path)
    return spec


def default_results_dir(path: str | Path) -> str:
    """Where a spec file without `results_dir` writes: results/<its name without .yaml>."""
    return f"results/{Path(path).stem}"


def dump_yaml(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=None)
