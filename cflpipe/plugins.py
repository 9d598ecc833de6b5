"""Methods, models and datasets from outside the package, without forking it.

Two ways in, for each of the three registries:

- a Python entry point of an installed package, in the group `cflpipe.methods`, `cflpipe.models`
  or `cflpipe.datasets`; the entry point's name is the name a spec uses (`method: fedavgm`);
- a `module:attr` reference written in the spec itself (`method: my_pkg.methods:FedAvgM`),
  imported from `sys.path` (an installed package, or a folder on PYTHONPATH).

Both are imported in every process that resolves the name, so they work in Snakemake and DVC
jobs as long as the package is installed (or PYTHONPATH is set) where the jobs run. A plugin is
imported only when a spec names it or when every name is listed (`cflpipe methods`, an unknown
name's error), so a broken plugin does not break specs that do not use it; a listing leaves it
out and says so, and a spec that names it gets one line naming the entry point or reference and
the exception. This module imports no torch.
"""

from __future__ import annotations

import importlib
import re
from functools import lru_cache
from importlib import metadata
from typing import Any

from cflpipe.errors import SpecError

METHODS_GROUP = "cflpipe.methods"
MODELS_GROUP = "cflpipe.models"
DATASETS_GROUP = "cflpipe.datasets"
# Trainers that run client work elsewhere (other processes, a Ray or Dask cluster): a Trainer
# subclass (cflpipe.fl.trainers), named by `training.trainer`.
TRAINERS_GROUP = "cflpipe.trainers"

# `package.module:attr` (attr may be dotted: `module:Outer.Inner`), as in entry point values.
REFERENCE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


class PluginError(SpecError):
    """A plugin that cannot be imported or does not provide what its name promises."""


def is_reference(name: Any) -> bool:
    return isinstance(name, str) and REFERENCE.fullmatch(name) is not None


@lru_cache(maxsize=None)
def _entry_points(group: str) -> tuple[metadata.EntryPoint, ...]:
    # Read once per process: installed packages do not change under a running job.
    return tuple(metadata.entry_points(group=group))


def entry_point_names(group: str) -> list[str]:
    """Names of the group's entry points, in a stable order, without importing anything."""
    return sorted({ep.name for ep in _entry_points(group)})


def _origin(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{ep.value}, from {dist.name} {dist.version}" if dist is not None else ep.value


def _describe(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def field_prefix(where: str | None) -> str:
    """"PATH: " to start an error line about the spec field at PATH, or nothing without one."""
    return f"{where}: " if where else ""


def load_entry_point(group: str, name: str, where: str | None = None) -> Any:
    """The object entry point `name` of `group` points to (KeyError when there is none)."""
    found = [ep for ep in _entry_points(group) if ep.name == name]
    if not found:
        raise KeyError(name)
    if len({ep.value for ep in found}) > 1:
        raise PluginError(f"{field_prefix(where)}entry point {name!r} of group {group} is declared more than once "
                          f"({'; '.join(_origin(ep) for ep in found)}); uninstall all but one")
    ep = found[0]
    try:
        return ep.load()
    except Exception as exc:  # whatever the plugin's import raises: reported as one line
        raise PluginError(f"{field_prefix(where)}entry point {name!r} of group {group} ({_origin(ep)}) failed to "
                          f"load: {_describe(exc)}") from None


def load_reference(reference: str, where: str | None = None) -> Any:
    """The object a `module:attr` reference names."""
    module_name, _, attr = reference.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:
        raise PluginError(f"{field_prefix(where)}cannot import module {module_name!r} of {reference!r}: {_describe(exc)} "
                          f"(install its package, or add its folder to PYTHONPATH)") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"{field_prefix(where)}module {module_name!r} has no attribute {attr!r} "
                              f"(from {reference!r})") from None
    return obj


def describe_object(obj: Any) -> str:
    """What a reference turned out to name, for an error line."""
    name = getattr(obj, "__qualname__", None) if isinstance(obj, type) or callable(obj) else None
    if name:
        return f"{getattr(obj, '__module__', '?')}.{name}"
    return f"an object of type {type(obj).__qualname__}"


def distributions_of(objects: tuple[Any, ...]) -> dict[str, str]:
    """{distribution: version} of the installed packages the objects' modules belong to, cflpipe's
    own left out. A module that belongs to no installed distribution (a folder on PYTHONPATH) has
    no version to record."""
    found: dict[str, str] = {}
    for obj in objects:
        top = (getattr(obj, "__module__", None) or "").partition(".")[0]
        if top in ("", "cflpipe"):
            continue
        for dist in _packages_distributions().get(top, []):
            found[dist] = metadata.version(dist)
    return dict(sorted(found.items()))


@lru_cache(maxsize=None)
def _packages_distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()
