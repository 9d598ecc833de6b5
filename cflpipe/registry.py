"""The method registry, on the package's lowest floor (no torch, nothing of fl/ or methods/ at
import: the engine, the spec checks and the report ask it, never the methods package). Each method registers itself by name together with a pydantic model of its
hyper-parameters (validated up front, like scikit-learn's estimators), so `cflpipe validate` and
`cflpipe methods` know every method without running it.

The built-in methods are declared each beside its module, in `methods/X_params.py` (their
hyper-parameters, capabilities, variants, premises and the round their clustering may start in),
modules without torch that `catalog` imports: validating a spec reads
the declarations and imports no method's implementation. A declared method's class is imported
the first time something asks for it (`MethodInfo.cls`: a run, `cflpipe methods NAME`), and
binds to its declaration as it is defined (`bind_declared`): the declaration is the one place that
names a built-in.

Methods from other packages register the same way and are found through the entry point group
`cflpipe.methods` or a `module:Class` reference as a spec's method type (cflpipe/plugins.py);
their module is imported to register them."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError


class HyperParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    # Hyper-parameters added after runs were recorded, with the value those runs had: left out of
    # a run's config.yaml at that value, so that a recorded run stays the same run (not retrained).
    later_defaults: ClassVar[dict[str, Any]] = {}

    def premises_at(self, clusters: int | None) -> list[tuple[str, str]]:
        """What these values go against at `clusters` clusters (the method's K where it has one):
        (key, why) pairs that validate warns of. A variant's parameters say their own (AWCFL's β)."""
        return []


@dataclass(frozen=True)
class Capabilities:
    """What a method is, declared once and read by spec validation and the report (nothing
    outside a method's own declaration names it).

    needs_groups:   it is told the ground-truth groups (Oracle): a reference, not a competitor
    clustered:      it assigns clients to clusters (clusters.parquet, ARI/NMI are meaningful)
    personalized:   clients are evaluated with models of their own
    k_param:        the hyper-parameter holding its number of clusters K; K must be <= clients
    batchable:      its plans may go to the batched trainer (False: always sequential)
    needs_public:   it uses the scenario's server-held unlabeled data (`public:`, FedTSDP)
    soft:           its clients belong to every cluster in shares (FedSoft): clusters.parquet and
                    ARI/NMI use each client's largest share, its `mixture.parquet` the shares
    pairs:          what it holds of every pair of clients, where its paper needs all pairs (a
                    matrix of similarities or distances); "" where its memory grows with the
                    round's clients or with N, never N²
    pair_bytes:     about how many bytes a pair of clients costs at its peak (N² · pair_bytes)
    pair_rows_bytes: what a pair adds with each evaluation that writes a long table of every
                    pair of the clients full evaluations read, E (held until the run ends):
                    `validate` warns where N² · pair_bytes + E² · evaluations · pair_rows_bytes
                    passes the machine's memory
    pairs_round:    the pairs are of a round's clients (N above: clients_per_round), as the
                    paper's are of every client under its full participation
    """

    needs_groups: bool = False
    clustered: bool = False
    personalized: bool = False
    k_param: str | None = None
    batchable: bool = True
    needs_public: bool = False
    soft: bool = False
    pairs: str = ""
    pair_bytes: int = 0
    pair_rows_bytes: int = 0
    pairs_round: bool = False

    def summary(self) -> str:
        flags = [name for name in ("needs_groups", "needs_public", "clustered", "personalized")
                 if getattr(self, name)]
        if self.soft:
            flags.append("soft assignment (ARI of the largest share)")
        if self.k_param:
            flags.append(f"K={self.k_param}")
        if not self.batchable:
            flags.append("sequential only")
        return ", ".join(flags)


# (hyper-parameters) -> (the hyper-parameter that delays clustering, the first 0-based round in
# which the method may form more than one cluster), or None: it may cluster from the start.
ClusteringStarts = Callable[[Any], "tuple[str, int] | None"]
# (hyper-parameters, resolved training, scenario) -> what in them goes against the method's own
# premises (a budget its clustering needs, a kind of group it cannot see): (the hyper-parameter
# at fault, or "" for the method as a whole; what is wrong and what to change), which `cflpipe
# validate` prints as warnings.
Premises = Callable[[Any, Any, Any], "list[tuple[str, str]]"]
# The same signature for what a run's settings cannot be for the method (a per-layer setting past
# the model's layers): (the hyper-parameter at fault, what is allowed), errors at validate.
Limits = Premises
# What kind of method it is, declared once with it (`cflpipe methods` groups by it, the report
# styles by it): told the true groups; no clustering and no personalization; personalized;
# clustered; one of the five source papers' methods; AWCFL's or MCFL's option on another method.
FAMILIES = ("reference", "baseline", "personalized", "clustered", "seed", "modifier")


def family_of(capabilities: "Capabilities") -> str:
    """The family of a method that declares none (a plugin's), read from its capabilities."""
    if capabilities.needs_groups:
        return "reference"
    if capabilities.clustered:
        return "clustered"
    return "personalized" if capabilities.personalized else "baseline"


@dataclass(frozen=True)
class MethodInfo:
    name: str
    params: type[HyperParams]
    # What the method is, in a sentence: "" for a declared one, whose class docstring's first
    # paragraph says it (read without importing the class: `description`).
    stated: str
    capabilities: Capabilities
    # "module:Qualname" of the class that implements it (imported by `cls` when first needed).
    implementation: str
    # The method it is a variant of (fcca for fcca_per, cfl for cfl_awcfl); None for a method.
    base: str | None = None
    starts: ClusteringStarts | None = None
    premises: Premises | None = None
    # What the method needs of a run for its clustering to mean anything, in a sentence (`cflpipe
    # methods` prints it; `premises` warns when a spec gives less).
    needs: str = ""
    family: str = ""  # one of FAMILIES; "" for a plugin's method: read from its capabilities
    limits: Limits | None = None
    variant_what: str = ""  # a variant's option, added to its base's description ("AWCFL's mixing")
    # What keeps it from #59's bars at 10,000 clients (server ≤ training, 3 GiB, evaluation within
    # two rounds), in a sentence; "" where it meets them (docs/performance.md, "Every clustered
    # method at scale"). `cflpipe methods NAME` prints it.
    at_scale: str = ""

    def __post_init__(self) -> None:
        if not self.family:
            object.__setattr__(self, "family", family_of(self.capabilities))
        if self.family not in FAMILIES:
            raise ValueError(f"method {self.name!r}: family {self.family!r} is none of {', '.join(FAMILIES)}")

    @property
    def description(self) -> str:
        """The method in a sentence (a variant's with its option); a declared method's is the first
        paragraph of its class docstring, stated there once."""
        text = self.stated or class_summary(self.implementation)
        return _variant_description(text, self.variant_what) if self.variant_what else text

    def premise_warnings(self, hp: Any, training: Any, scenario: Any) -> list[tuple[str, str]]:
        """What in a run's settings or scenario goes against the method's premises (declared, or
        given to a plugin's `register`)."""
        found = [] if self.premises is None else list(self.premises(hp, training, scenario))
        k = self.capabilities.k_param and getattr(hp, self.capabilities.k_param, None)
        if isinstance(hp, HyperParams):
            found += hp.premises_at(k if isinstance(k, int) else None)
        return found

    def limit_errors(self, hp: Any, training: Any, scenario: Any) -> list[tuple[str, str]]:
        """What in a run's settings the method cannot run with (declared, or given to `register`)."""
        return [] if self.limits is None else list(self.limits(hp, training, scenario))

    @property
    def cls(self) -> type:
        """The implementing class, its module imported on first use (defining a built-in's class
        binds it to its declaration; a plugin's @register binds its own)."""
        if self.implementation not in _CLASSES:
            module, _, qualname = self.implementation.partition(":")
            found: Any = importlib.import_module(module)
            for part in qualname.split("."):
                found = getattr(found, part, None)
            if not isinstance(found, type):
                raise ImportError(f"{module} defines no method class {qualname} for method {self.name!r}")
            if self.implementation not in _CLASSES:  # its module was imported before the table was reset
                bind_declared(found)
                _CLASSES.setdefault(self.implementation, found)
        return _CLASSES[self.implementation]

    @property
    def module(self) -> str:
        return self.implementation.partition(":")[0]

    def clustering_starts(self, hp: Any) -> tuple[str, int] | None:
        """The hyper-parameter that delays clustering and the first round (0-based) in which the
        method may form more than one cluster with these hyper-parameters; None: from the start.
        `cflpipe validate` warns when that round is at or past the run's last one."""
        if self.starts is not None:
            return self.starts(hp)
        if self.implementation in _CLASSES:  # a plugin's class that gave none: its nearest declared ancestor's
            return declared_starts(_CLASSES[self.implementation], hp)
        return None


# The built-in methods' package: its `catalog` imports their declarations (`X_params.py`), its modules implement them.
BUILTIN_PACKAGE = "cflpipe.methods"

METHODS: dict[str, MethodInfo] = {}
# What `declare` said of each built-in method and variant (METHODS holds them too).
DECLARED: dict[str, MethodInfo] = {}
# The registered classes by "module:Qualname" (a declared method's once its module is imported).
_CLASSES: dict[str, type] = {}


# Variants a declaration or a class adds: (variant name, parameters it adds or replaces, what it adds).
Variant = "tuple[str, type[HyperParams], str]"


def _variant_params(params: type[HyperParams], extra: type[HyperParams]) -> type[HyperParams]:
    # A variant's parameters either add fields (a mixin) or subclass the method's own parameters
    # with other defaults (FCCA+Per: personal=True).
    if params is HyperParams or issubclass(extra, params):
        return extra
    # A plugin's parameters that subclass the ones the variant subclasses (its FCCA's, say):
    # the variant's defaults come first, or the inherited ones would win and the variant would
    # be the method itself. A mixin comes after, as the field order of existing runs has it.
    shared = any(issubclass(extra, base) for base in params.__mro__[1:]
                 if isinstance(base, type) and issubclass(base, HyperParams) and base is not HyperParams)
    bases = (extra, params) if shared else (params, extra)
    return type(f"{params.__name__}{extra.__name__}", bases, {})


@functools.lru_cache(maxsize=None)
def class_summary(implementation: str) -> str:
    """The first paragraph of the docstring of class `module:Qualname`, read from the module's
    source, not imported (a method's module imports torch; listing and validating must not)."""
    module, qualname = implementation.split(":")
    found = importlib.util.find_spec(module)
    node: Any = ast.parse(Path(found.origin).read_text(encoding="utf-8"))
    for part in qualname.split("."):
        node = next(n for n in node.body if isinstance(n, ast.ClassDef) and n.name == part)
    return first_paragraph(ast.get_docstring(node) or "")


def first_paragraph(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].split())


def _variant_description(description: str, what: str) -> str:
    head, _, rest = description.partition(":")
    return f"{head} + {what}: {rest.strip()}"


def declare(name: str, params: type[HyperParams], implementation: str,
            capabilities: Capabilities = Capabilities(), starts: ClusteringStarts | None = None,
            variants: "tuple[Variant, ...]" = (), premises: Premises | None = None, needs: str = "", *,
            family: str, variant_family: str | None = None, limits: Limits | None = None,
            description: str = "", at_scale: str = "") -> None:
    """Declare a method without importing it: its family (FAMILIES; its variants' when they differ),
    hyper-parameters, capabilities, when its clustering may start, what its premises ask of a run
    (warned about by validate), what its limits refuse (errors at validate), its variants (each the same class with the variant's parameters)
    and the `module:Class` that implements it (bound to this declaration as it is defined)."""
    infos = [MethodInfo(name, params, description, capabilities, implementation, starts=starts, premises=premises,
                        needs=needs, family=family, limits=limits, at_scale=at_scale)]
    infos += [MethodInfo(variant, _variant_params(params, extra), description, capabilities, implementation,
                         base=name, starts=starts, premises=premises, needs=needs, family=variant_family or family,
                         limits=limits, variant_what=what, at_scale=at_scale)
              for variant, extra, what in variants]
    for info in infos:
        _add(info)
        DECLARED[info.name] = info


def declared_starts(cls: type, hp: Any) -> tuple[str, int] | None:
    """The clustering start of the nearest declared class in `cls`'s ancestry (a plugin's
    subclass of CFL delays its clustering as CFL does), or None."""
    for base in cls.__mro__:
        where = f"{base.__module__}:{base.__qualname__}"
        info = next((i for i in DECLARED.values() if i.implementation == where and i.base is None), None)
        if info is not None:
            try:
                return info.starts(hp) if info.starts is not None else None
            except AttributeError:  # a subclass whose parameters lack the ancestor's key
                return None
    return None


# Runs at import, before mutmut picks a mutant: its mutants could never run (docs/testing.md).
def register(name: str, params: type[HyperParams] = HyperParams, *, starts: ClusteringStarts | None = None,
             premises: Premises | None = None, needs: str = "", limits: Limits | None = None,
             at_scale: str = ""):  # pragma: no mutate block
    """Register a plugin's method class under `name`, with what `declare` says of a built-in:
    when its clustering may start (`starts`; by default its nearest declared ancestor's, so a
    subclass of CFL delays its clustering as CFL does), what its premises ask of a run
    (`premises`, warned about by validate), what it cannot run with (`limits`, errors at validate)
    and, in a sentence, what it needs (`needs`) and what keeps it from the bars at 10,000
    clients (`at_scale`, printed by `cflpipe methods NAME`; docs/performance.md). A class
    that offers variants (the cluster-model base: AWCFL and MCFL) registers them here too, as the
    same class with the variant's hyper-parameters added, so they exist whatever order the
    modules are imported in.

    The built-in methods do not register: each is declared in its module's `X_params.py`, and its class is bound to
    the declaration when it is defined (`bind_declared`)."""

    def decorate(cls: type) -> type:
        _load_all()
        where = f"{cls.__module__}:{cls.__qualname__}"
        declared = DECLARED.get(name)
        if declared is not None and declared.implementation == where:
            raise ValueError(f"method {name!r}: {where} is declared in {cls.__module__}_params; "
                             f"the declaration is the one place that names it (remove @register)")
        cls.name = name
        description = first_paragraph(inspect.getdoc(cls) or "")
        capabilities = cls.capabilities
        if capabilities.clustered and capabilities.k_param is None and "clusters" in params.model_fields:
            # a subclass of the cluster-model base that states no K: its `clusters` is K, checked
            # against the clients at validate as every built-in's is
            capabilities = cls.capabilities = replace(capabilities, k_param="clusters")
        _add(MethodInfo(name, params, description, capabilities, where, starts=starts, premises=premises, needs=needs,
                        limits=limits, at_scale=at_scale))
        for variant, extra, what in (cls.variants(name) if hasattr(cls, "variants") else []):
            _add(MethodInfo(variant, _variant_params(params, extra), description, capabilities, where, base=name,
                            starts=starts, premises=premises, needs=needs, family=getattr(cls, "variant_family", ""),
                            limits=limits, variant_what=what, at_scale=at_scale))
        _CLASSES[where] = cls
        return cls

    return decorate


def bind_declared(cls: type) -> None:  # pragma: no mutate block
    """Bind a class being defined to the declaration (`X_params.py`) that names it as a method's
    implementation (its name and capabilities come from there); other classes are left alone.
    Called by the method base class for every subclass, so a built-in needs no decorator."""
    _load_all()
    where = f"{cls.__module__}:{cls.__qualname__}"
    declared = next((info for info in DECLARED.values() if info.implementation == where and info.base is None), None)
    if declared is None:
        return
    bound = {"capabilities": declared.capabilities, "name": declared.name}  # what an earlier binding set
    own = [key for key in ("capabilities", "variants", "name")
           if key in vars(cls) and vars(cls)[key] is not bound.get(key)]
    if own:
        raise ValueError(f"method {declared.name!r}: {where} sets {own[0]!r}, which its declaration in "
                         f"{cls.__module__}_params holds")
    cls.name = declared.name
    cls.capabilities = declared.capabilities
    _CLASSES[where] = cls


def _add(info: MethodInfo) -> None:
    from cflpipe.spec import RESERVED_ENTRY_KEYS

    # A spec's method entry reads these keys itself: such a hyper-parameter could never be set.
    reserved = [key for key in info.params.model_fields if key in RESERVED_ENTRY_KEYS]
    if reserved:
        raise ValueError(f"method {info.name!r}: hyper-parameter {reserved[0]!r} of {info.params.__qualname__} "
                         f"is a key of a spec's method entry ({', '.join(RESERVED_ENTRY_KEYS)}); rename it")
    # A plugin registering a taken name would silently replace a method (and every result of it).
    old = METHODS.get(info.name)
    if old is not None and old.implementation != info.implementation:
        raise ValueError(f"method name {info.name!r} is already registered by "
                         f"{old.implementation.replace(':', '.')}; choose another name")
    METHODS[info.name] = info


_BUILTIN_LOADED = False
_PLUGINS_LOADED = False
# One line per method plugin that failed in _load_plugins (each left out of the listings).
_PLUGIN_FAILURES: list[str] = []


def _load_all() -> None:
    """Declare the built-in methods (torch-free: their implementations are imported on demand)."""
    global _BUILTIN_LOADED
    if _BUILTIN_LOADED:
        return
    importlib.import_module(f"{BUILTIN_PACKAGE}.catalog")
    _BUILTIN_LOADED = True


def _is_builtin(name: str) -> bool:
    # By the defining module, not by registration order: a plugin may be imported before these.
    info = METHODS.get(name)
    return info is not None and info.module.startswith(f"{BUILTIN_PACKAGE}.")


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
    entry's own values (the same order as `training` overrides, most specific last), then what its
    tuning chose (a spec read with_tuning_choices)."""
    info = method_info(spec.method_type(method))
    return info.params(**{**scenario_hyperparams(spec, scenario, method), **spec.methods[method].hyperparams,
                          **spec.chosen(scenario, method).hyperparams})


def scenario_hyperparams(spec, scenario: str, method: str) -> dict[str, Any]:
    """The keys of `scenarios.S.hyperparams` that `method` has."""
    fields = method_info(spec.method_type(method)).params.model_fields
    return {key: value for key, value in spec.scenarios[scenario].hyperparams.items() if key in fields}
