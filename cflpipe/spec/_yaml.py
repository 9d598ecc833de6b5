"""Spec files: reading them (YAML 1.2's duplicate keys and floats, size and encoding limits),
where a spec file without `results_dir` writes, and writing YAML."""

from __future__ import annotations

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


def load_spec(path: str | Path, **kwargs: Any) -> Spec:
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
    spec = parse_spec(data, **kwargs)
    spec._source = str(path)
    return spec


def default_results_dir(path: str | Path) -> str:
    """Where a spec file without `results_dir` writes: results/<its name without .yaml>."""
    return f"results/{Path(path).stem}"


def dump_yaml(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=None)
