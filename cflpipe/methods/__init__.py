"""Method registry. Each method lives in its own module and registers itself by name together
with a pydantic model of its hyper-parameters (validated up front, like scikit-learn's
estimators), so `cflpipe validate` and `cflpipe methods` know every method without running it.

Methods from other packages register the same way and are found through the entry point group
`cflpipe.methods` or a `module:Class` reference as a spec's method type (cflpipe/plugins.py)."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class HyperParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


@dataclass(frozen=True)
class MethodInfo:
    name: str
    cls: type
    params: type[HyperParams]
    description: str

    @property
    def capabilities(self):
        return self.cls.capabilities


METHODS: dict[str, MethodInfo] = {}


# Runs at import, before mutmut picks a mutant: its mutants could never run (docs/testing.md).
def register(name: str, params: type[HyperParams] = HyperParams):  # pragma: no mutate block
    """Register a method class under `name`. A class that offers variants (the cluster-model
    base: AWCFL and MCFL) registers them here too, as the same class with the variant's
    hyper-parameters added, so they exist whatever order the modules are imported in."""

    def decorate(cls: type) -> type:
        doc = (cls.__doc__ or "").strip().splitlines()
        description = doc[0] if doc else ""
        _add(MethodInfo(name, cls, params, description))
        cls.name = name
        for variant, extra, what in (cls.variants(name) if hasattr(cls, "variants") else []):
            # A variant's parameters either add fields (a mixin) or subclass the method's own
            # parameters with other defaults (FCCA+Per: personal=True).
            merged = extra if params is HyperParams or issubclass(extra, params) else \
                type(f"{params.__name__}{extra.__name__}", (params, extra), {})
            head, _, rest = description.partition(":")
            _add(MethodInfo(variant, cls, merged, f"{head} + {what}: {rest.strip()}"))
        return cls

    return decorate


def _add(info: MethodInfo) -> None:
    from cflpipe.spec import RESERVED_ENTRY_KEYS

    # A spec's method entry reads these keys itself: such a hyper-parameter could never be set.
    reserved = [key for key in info.params.model_fields if key in RESERVED_ENTRY_KEYS]
    if reserved:
        raise ValueError(f"method {info.name!r}: hyper-parameter {reserved[0]!r} of {info.params.__qualname__} "
                         f"is a key of a spec's method entry ({', '.join(RESERVED_ENTRY_KEYS)}); rename it")
    # A plugin registering a taken name would silently replace a method (and every result of it).
    old = METHODS.get(info.name)
    if old is not None and (old.cls.__module__, old.cls.__qualname__) != (info.cls.__module__, info.cls.__qualname__):
        raise ValueError(f"method name {info.name!r} is already registered by "
                         f"{old.cls.__module__}.{old.cls.__qualname__}; choose another name")
    METHODS[info.name] = info


_BUILTIN_LOADED = False
_PLUGINS_LOADED = False
# One line per method plugin that failed in _load_plugins (each left out of the listings).
_PLUGIN_FAILURES: list[str] = []


def _load_all() -> None:
    """Import the built-in methods (each registers itself)."""
    global _BUILTIN_LOADED
    if _BUILTIN_LOADED:
        return
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    _BUILTIN_LOADED = True


def _is_builtin(name: str) -> bool:
    # By the defining module, not by registration order: a plugin may be imported before these.
    info = METHODS.get(name)
    return info is not None and info.cls.__module__.startswith(f"{__name__}.")


def _load_entry_point(name: str, where: str | None = None) -> None:
    from cflpipe.plugins import METHODS_GROUP, PluginError, field_prefix, load_entry_point

    _load_all()
    if _is_builtin(name):
        raise PluginError(f"{field_prefix(where)}entry point {name!r} of group {METHODS_GROUP} has the "
                          f"name of a built-in method; give it another name")
    obj = load_entry_point(METHODS_GROUP, name, where)
    registered = getattr(obj, "name", None) if isinstance(obj, type) else None
    if name not in METHODS:
        what = f"registers {registered!r}" if registered in METHODS else "registers no method of that name"
        raise PluginError(f"{field_prefix(where)}entry point {name!r} of group {METHODS_GROUP} "
                          f"{what}; decorate its class with @cflpipe.methods.register({name!r}, PARAMS)")


def _load_plugins() -> None:
    """Import every installed method plugin (entry points), once. This is only for listing names
    (or looking for a variant a plugin registers), so a plugin that fails is left out and noted in
    _PLUGIN_FAILURES: an unrelated broken plugin must not hide the name a spec got wrong. A spec
    that names the plugin gets its error from method_info."""
    global _PLUGINS_LOADED, _PLUGIN_FAILURES
    if _PLUGINS_LOADED:
        return
    from cflpipe.plugins import METHODS_GROUP, PluginError, entry_point_names

    _load_all()
    failures = []
    for name in entry_point_names(METHODS_GROUP):
        try:
            _load_entry_point(name)
        except PluginError as exc:
            failures.append(str(exc))
    _PLUGIN_FAILURES = failures
    _PLUGINS_LOADED = True


def plugin_failures() -> list[str]:
    """One line for each installed method plugin that does not load (left out of method_names
    and all_methods)."""
    _load_plugins()
    return list(_PLUGIN_FAILURES)


def unknown_method(name: str, where: str | None = None) -> str:
    """The error line for a method type that does not exist, naming the plugins that could not be
    looked in."""
    from cflpipe.plugins import field_prefix

    skipped = "".join(f"; left out: {line}" for line in plugin_failures())
    return f"{field_prefix(where)}unknown method {name!r}; allowed: {', '.join(method_names())} " \
           f"(or a module:Class reference){skipped}"


def _from_reference(reference: str, where: str | None) -> MethodInfo:
    """A `module:Class` method type: the registered method of that class, under the reference."""
    from cflpipe.plugins import PluginError, field_prefix, load_reference

    obj = load_reference(reference, where)
    info = METHODS.get(getattr(obj, "name", None)) if isinstance(obj, type) else None
    if info is None or info.cls is not obj:
        raise PluginError(f"{field_prefix(where)}{reference!r} is not a method class registered with "
                          f"@cflpipe.methods.register(NAME, PARAMS)")
    METHODS[reference] = info
    return info


def method_info(name: str, where: str | None = None) -> MethodInfo:
    """The method a spec's type names: built in, an installed plugin's, or a `module:Class`
    reference (KeyError when there is none). Plugins are imported only for a name that is not
    built in, so a broken plugin does not break specs that do not use it."""
    from cflpipe.plugins import METHODS_GROUP, entry_point_names, is_reference

    _load_all()
    if name in METHODS:
        return METHODS[name]
    if is_reference(name):
        return _from_reference(name, where)
    if name in entry_point_names(METHODS_GROUP):
        _load_entry_point(name, where)
    else:  # a variant a plugin's class registers (`<name>_awcfl`), or an unknown name
        _load_plugins()
    if name not in METHODS:
        raise KeyError(name)
    return METHODS[name]


def method_names() -> list[str]:
    """Every method name a spec may use (built in and plugins' that load; references aside), sorted."""
    _load_plugins()
    return sorted(name for name in METHODS if ":" not in name)


def all_methods() -> dict[str, MethodInfo]:
    """Every registered method, plugins that load included (each imported now; plugin_failures
    names the others)."""
    _load_plugins()
    return dict(sorted(METHODS.items()))


def validate_method_entry(method_type: str, hyperparams: dict[str, Any], where: str,
                          type_field: str | None = None) -> list[str]:
    """Problems with one `methods:` entry, as YAML-path lines; `type_field` is where the method
    type was written (the entry's `method:` key, or the entry name itself)."""
    from cflpipe.errors import SpecError
    from cflpipe.spec import errors_to_lines

    try:
        info = method_info(method_type, type_field or where)
    except KeyError:
        return [unknown_method(method_type, type_field or where)]
    except SpecError as exc:  # a plugin that does not load
        return [str(exc)]
    try:
        info.params(**hyperparams)
    except ValidationError as exc:
        return errors_to_lines(exc, hyperparams, where, model=info.params)
    return []


def resolved_hyperparams(spec, scenario: str, method: str) -> HyperParams:
    """The hyper-parameters of `method` on `scenario`: the method's defaults, then the scenario's
    `hyperparams` that the method has (e.g. K = the scenario's true groups), then the method
    entry's own values (the same order as `training` overrides, most specific last)."""
    info = method_info(spec.method_type(method))
    return info.params(**{**scenario_hyperparams(spec, scenario, method), **spec.methods[method].hyperparams})


def scenario_hyperparams(spec, scenario: str, method: str) -> dict[str, Any]:
    """The keys of `scenarios.S.hyperparams` that `method` has."""
    fields = method_info(spec.method_type(method)).params.model_fields
    return {key: value for key, value in spec.scenarios[scenario].hyperparams.items() if key in fields}
