"""`parse_spec`: a spec's data validated into a `Spec`, then checked across its parts (datasets,
training overrides, methods and their hyper-parameters, models, labels), one line per problem;
and `spec_warnings`, what a valid spec asks for that makes a result meaningless."""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import ValidationError

from cflpipe.errors import SpecError
from cflpipe.fl.axes import scenario_axes
from cflpipe.spec._errors import _format_error, _short, errors_to_lines
from cflpipe.spec._models import MODEL_NAMES, TRAINING_KEYS, Scenario, Training, evaluated_clients, merge_training
from cflpipe.spec._spec import Spec
from cflpipe.spec._sweeps import _sweep_paths, expand_sweeps


def parse_spec(data: Any, *, check_methods: bool = True, check_datasets: bool = True) -> Spec:
    if not isinstance(data, dict):
        raise SpecError(f"spec: must be a mapping of seeds/training/scenarios/methods, got {_short(data)}")
    _check_expanded_size(data)
    non_finite = list(_non_finite_numbers(data, ""))
    if non_finite:
        raise SpecError("\n".join(f"{where}: must be a finite number, got {value}" for where, value in non_finite))
    data, origins = expand_sweeps(data)
    data = _tuning_space_of_sweeps(data, origins)
    try:
        spec = Spec(**data)
    except ValidationError as exc:
        lines = errors_to_lines(exc, data, model=Spec)
        lines += [line for line in _raw_cross_field(data) if line not in lines]
        lines += [line for line in _checks_of_the_rest(data, exc, origins, check_methods, check_datasets)
                  if line not in lines]
        raise SpecError("\n".join(_sweep_paths(lines, origins))) from None
    spec._sweeps = origins
    problems = _trials_only(data) + _cross_checks(spec, data, check_methods, check_datasets)
    if problems:
        # A bad scenario override would otherwise be reported once per method.
        raise SpecError("\n".join(_sweep_paths(problems, origins)))
    return spec


def _trials_only(data: dict) -> list[str]:
    """`training.eval_test: false` is what tuning gives its trials; a spec's own runs are
    aggregated and reported, which needs their test figures."""
    layers = [("training", data.get("training"))]
    layers += [(f"scenarios.{name}.training", sc.get("training")) for name, sc in data["scenarios"].items()
               if isinstance(sc, dict)]
    layers += [(f"methods.{name}.training", entry.get("training")) for name, entry in data["methods"].items()
               if isinstance(entry, dict)]
    return [f"{where}.eval_test: false is set by tuning for its trials (they read no test data); a spec's own "
            f"runs are reported on their test splits, so leave it out" for where, layer in layers
            if isinstance(layer, dict) and layer.get("eval_test") is False]


def _checks_of_the_rest(data: dict, exc: ValidationError, origins: dict, check_methods: bool,
                        check_datasets: bool) -> list[str]:
    """The cross-field problems of what is valid in a spec that is not: the spec less its invalid
    scenario and method entries (and the methods' references to a scenario left out; `seeds` at
    its default without tuning), checked as a valid one is, so that one `validate` says every
    problem it can, and nothing of a part left out. Where another part is invalid (training, the
    report, tuning), its default could clash with the rest: nothing more is checked."""
    repaired, dropped = dict(data), {"scenarios": set(), "methods": set()}
    for err in exc.errors():
        loc = tuple(err["loc"])
        if loc[:1] == ("seeds",) and "tuning" not in data:
            repaired.pop("seeds", None)
        elif len(loc) > 1 and loc[0] in dropped and isinstance(repaired.get(loc[0]), dict):
            dropped[loc[0]].add(loc[1])
        else:
            return []
    for key, names in dropped.items():
        repaired[key] = {name: value for name, value in repaired.get(key, {}).items() if name not in names}
    methods, places = {}, {}  # places: a pruned scenario list's positions in the file's list
    for name, entry in repaired["methods"].items():
        listed = entry.get("scenarios") if isinstance(entry, dict) else None
        if isinstance(listed, list) and dropped["scenarios"]:
            places[name] = [i for i, s in enumerate(listed) if s not in dropped["scenarios"]]
            entry = {**entry, "scenarios": [listed[i] for i in places[name]]}
            if not entry["scenarios"]:
                continue
        methods[name] = entry
    repaired["methods"] = methods
    if not repaired["scenarios"] or not repaired["methods"]:
        return []
    try:
        spec = Spec(**repaired)
    except ValidationError:
        return []
    spec._sweeps = origins
    # Without a method left out, a scenario's hyperparams that only it took would look unused.
    lines = _cross_checks(spec, repaired, check_methods, check_datasets,
                          scenario_hyperparams=len(methods) == len(data["methods"]))

    def placed(match: re.Match) -> str:
        method, index = match.group(1), int(match.group(2))
        return f"methods.{method}.scenarios[{places[method][index] if method in places else index}]"

    return [re.sub(r"^methods\.([^.\[]+)\.scenarios\[(\d+)\]", placed, line) for line in lines]


def _cross_checks(spec: Spec, data: dict, check_methods: bool, check_datasets: bool,
                  scenario_hyperparams: bool = True) -> list[str]:
    """The checks across a valid spec's parts, one line per problem."""
    problems: list[str] = _check_labels(spec)
    for name, scenario in spec.scenarios.items():
        base = f"scenarios.{name}"
        if check_datasets:
            problems += _check_dataset(scenario, base)
        problems += _check_training(spec, data, name, None)
    for method, entry in spec.methods.items():
        for index, name in enumerate(entry.scenarios or []):
            if name not in spec.scenarios:
                problems.append(f"methods.{method}.scenarios[{index}]: unknown scenario {name!r}; "
                                f"allowed: {', '.join(spec.scenarios)}")
        for scenario in spec.scenarios:
            if spec.runs_on(method, scenario):
                problems += _check_training(spec, data, scenario, method)
        if check_methods:
            problems += _check_method(spec, method)
    if check_methods:
        problems += _check_scenario_hyperparams(spec) if scenario_hyperparams else []
        problems += _check_models(spec)
        # The tuning section's own rules always; its trials, run by run, once the methods they
        # copy are valid (a method's problem would come back once per trial).
        problems += _check_tuning(spec, data, trials=not problems)
    return problems


def _raw_cross_field(data: dict) -> list[str]:
    """The rules across fields that the models check only once every field is valid, read from
    the raw spec where its parts can be read, so that one `validate` reports them beside the
    structural errors (a scenario with two label splits, clients_per_round above its clients)."""
    from cflpipe.spec._models import LABEL_SPLITS

    lines = []
    scenarios = data.get("scenarios") if isinstance(data.get("scenarios"), dict) else {}
    training = data.get("training") if isinstance(data.get("training"), dict) else {}
    for name, sc in scenarios.items():
        if not isinstance(sc, dict):
            continue
        steps = sc.get("partition") if isinstance(sc.get("partition"), list) else []
        splits = [s.get("kind") for s in steps if isinstance(s, dict) and s.get("kind") in LABEL_SPLITS]
        if len(splits) > 1:
            lines.append(f"scenarios.{name}: partition has more than one label split ({', '.join(splits)}); "
                         f"use one of {', '.join(LABEL_SPLITS)}")
        own = sc.get("training") if isinstance(sc.get("training"), dict) else {}
        per_round, clients = own.get("clients_per_round", training.get("clients_per_round")), sc.get("clients")
        if isinstance(per_round, int) and isinstance(clients, int) and not isinstance(clients, bool) \
                and per_round > clients >= 1:
            where = f"scenarios.{name}.training" if "clients_per_round" in own else "training"
            lines.append(f"{where}.clients_per_round: must be <= clients of scenario {name} ({clients}), "
                         f"got {per_round}")
    return lines


def _check_models(spec: Spec) -> list[str]:
    """Models that are not built in (a plugin's, a module:Class reference) import: one line at the
    key that names them when they do not. Other names are Training's to refuse: one line per mistake.
    Built-in models are known by name: torch is imported only to load a plugin's."""
    from cflpipe.plugins import MODELS_GROUP, entry_point_names, is_reference

    layers = [("training", spec.training.model_dump())]
    layers += [(f"scenarios.{name}.training", sc.training) for name, sc in spec.scenarios.items()]
    layers += [(f"methods.{name}.training", entry.training) for name, entry in spec.methods.items()]
    problems = []
    for where, layer in layers:
        model = layer.get("model")
        if isinstance(model, str) and model not in MODEL_NAMES and \
                (is_reference(model) or model in entry_point_names(MODELS_GROUP)):
            from cflpipe.models import model_factory

            try:
                model_factory(model, f"{where}.model")
            except SpecError as exc:
                problems.append(str(exc))
    return problems


def _check_labels(spec: Spec) -> list[str]:
    """Two entries shown under one name would be one legend entry and one table row."""
    problems = []
    for key, entries in (("scenarios", spec.scenarios), ("methods", spec.methods)):
        shown: dict[str, str] = {}
        for name, entry in entries.items():
            text = entry.label or name
            if text in shown:
                other = shown[text]
                if entry.label:
                    problems.append(f"{key}.{name}.label: {text!r} is already the name shown for {key}.{other}; "
                                    f"a label must differ from every other entry's label and name")
                else:
                    problems.append(f"{key}.{other}.label: {text!r} is the name of {key}.{name}; a label must "
                                    f"differ from every other entry's label and name")
            shown[text] = name
    return problems


# Values a spec may hold once YAML aliases are expanded: far above any real spec (a 1 MiB file
# has at most about 500,000 values), far below what an alias bomb expands to (10^9 and more).
MAX_SPEC_VALUES = 1_000_000


def _check_expanded_size(data: Any) -> None:
    """Refuse a spec whose aliases expand it beyond MAX_SPEC_VALUES values, or that contains
    itself, in time linear in its distinct nodes: every later step walks the expanded tree."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(value: Any) -> int:
        if not isinstance(value, (dict, list, tuple)):
            return 1
        key = id(value)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise SpecError("spec: a YAML alias refers to a mapping or list that contains it (a cycle); "
                            "a spec is a finite tree")
        open_nodes.add(key)
        children = value.values() if isinstance(value, dict) else value
        total = 1 + sum(size(child) for child in children) + (len(value) if isinstance(value, dict) else 0)
        open_nodes.discard(key)
        sizes[key] = total
        if total > MAX_SPEC_VALUES:
            raise SpecError(f"spec: its YAML aliases expand it to more than {MAX_SPEC_VALUES:,} values (an alias "
                            f"bomb?); write the values out, or use fewer nested aliases")
        return total

    try:
        size(data)
    except RecursionError:
        raise SpecError("spec: nested too deeply to be a spec") from None


def _non_finite_numbers(value: Any, where: str):
    """(YAML path, value) of every NaN or ±inf anywhere in the spec: no field of a spec, a
    method's hyper-parameters or a dataset's parameters means anything with them, and bounds
    such as `gt=0` let +inf through."""
    if isinstance(value, float) and not math.isfinite(value):
        yield where or "spec", value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite_numbers(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _non_finite_numbers(item, f"{where}[{index}]")


def _check_dataset(scenario: Scenario, base: str) -> list[str]:
    from cflpipe.data.base import dataset_info

    try:
        info = dataset_info(scenario.dataset.name, f"{base}.dataset")
    except SpecError as exc:
        return [str(exc)]
    try:
        info.params(**scenario.dataset.params)
    except ValidationError as exc:
        return errors_to_lines(exc, scenario.dataset.params, f"{base}.dataset", model=info.params)
    return []


def training_key_path(spec: Spec, scenario: str, method: str, key: str) -> str:
    """Where a run's training setting comes from: `methods.M.training.key`, then the scenario's,
    then the spec's `training.key` (also where a default is reported)."""
    layers = [(f"methods.{method}.training", spec.methods[method].training),
              (f"scenarios.{scenario}.training", spec.scenarios[scenario].training)]
    return next((f"{where}.{key}" for where, layer in layers if key in layer), f"training.{key}")


def _check_training(spec: Spec, data: dict, scenario: str, method: str | None) -> list[str]:
    layers = [("training", spec.training.model_dump())]
    layers.append((f"scenarios.{scenario}.training", spec.scenarios[scenario].training))
    if method is not None:
        layers.append((f"methods.{method}.training", spec.methods[method].training))
    merged: dict[str, Any] = {}
    problems = []
    for where, layer in layers[1:]:
        for key in layer:
            if key not in TRAINING_KEYS:
                problems.append(f"{where}.{key}: unknown key; allowed: {', '.join(TRAINING_KEYS)}")
    if problems:
        return problems
    merged = merge_training([layer for _, layer in layers])
    try:
        training = Training(**merged)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = err["loc"][0] if err["loc"] else None
            if key is None:  # a rule across keys: blame the layer that set the local budget
                where = next((w for w, layer in reversed(layers)
                              if {"local_steps", "local_epochs"} & set(layer)), layers[0][0])
            else:
                where = next((w for w, layer in reversed(layers) if key in layer), layers[0][0])
            lines.append(_format_error(err, merged, where))
        return lines
    # Across layers, every problem of the run's settings and scenario at once (one validate pass).
    found: list[str] = []
    image_models = ("cnn", "cnn_tsdp", "cnn_pfl", "resnet18")
    if training.model in image_models:
        from cflpipe.data.base import dataset_info

        dataset = spec.scenarios[scenario].dataset.name
        if _registered(dataset) and dataset_info(dataset).images is False:
            where = next((w for w, layer in reversed(layers) if "model" in layer), "training")
            found.append(f"{where}.model: {training.model} needs images, but scenario {scenario}'s dataset "
                         f"{dataset} has feature vectors; use mlp")
    # A run's merged training (a method's layer may add the sample).
    if method is not None and training.full_eval_every is not None and training.eval_clients is None:
        where = next((w for w, layer in reversed(layers) if "full_eval_every" in layer), "training")
        found.append(f"{where}.full_eval_every: needs eval_clients (without a sample every evaluation is full), "
                     f"got {training.full_eval_every}")
    sc = spec.scenarios[scenario]
    if sc.participants < 1:
        found.append(f"scenarios.{scenario}.new_clients: {sc.new_clients} of {sc.clients} clients holds out "
                     f"{sc.new_client_count()}, leaving none to train; allowed: a share that leaves at least one")
    for index, event in enumerate(sc.drift or []):
        if event.round > training.rounds:
            where = next((w for w, layer in reversed(layers) if "rounds" in layer), "training")
            found.append(f"scenarios.{scenario}.drift[{index}].round: must be <= the rounds of its runs "
                         f"({where}.rounds: {training.rounds}), got {event.round}")
    for key, axis in scenario_axes().items():
        if (settings := getattr(sc, key)) is not None:
            where = next((w for w, layer in reversed(layers) if "rounds" in layer), "training")
            found += axis.check(settings, f"scenarios.{scenario}.{key}", training.rounds, where, sc.participants)
    if sc.participants >= 1 and training.clients_per_round > sc.participants:
        where = next((w for w, layer in reversed(layers) if "clients_per_round" in layer), "training")
        of = f" less its {sc.new_client_count()} new clients" if sc.new_clients is not None else ""
        found.append(f"{where}.clients_per_round: must be <= clients of scenario {scenario}{of} ({sc.participants}), "
                     f"got {training.clients_per_round}")
    return found


def _registered(dataset: str) -> bool:
    """Unknown datasets are reported by the dataset check; here they are just skipped."""
    from cflpipe.data.base import dataset_info

    try:
        dataset_info(dataset)
    except SpecError:
        return False
    return True


def _check_method(spec: Spec, method: str) -> list[str]:
    from cflpipe.registry import METHODS, resolved_hyperparams, scenario_hyperparams, validate_method_entry

    entry = spec.methods[method]
    where = f"methods.{method}"
    origin = spec._sweeps.get(method)
    typed = entry.method and (origin is None or origin.typed)
    problems = validate_method_entry(spec.method_type(method), entry.hyperparams, where,
                                     f"{where}.method" if typed else where)
    if problems:
        return problems
    info = METHODS[spec.method_type(method)]
    capabilities = info.capabilities
    for scenario, sc in spec.scenarios.items():
        if not spec.runs_on(method, scenario):
            continue
        shared = scenario_hyperparams(spec, scenario, method)
        if not shared:
            continue
        # The values the method gets on this scenario, checked together (some rules span two
        # keys); a problem is reported where its key was written last.
        merged = {**shared, **entry.hyperparams}
        problems = validate_method_entry(spec.method_type(method), merged, where)
        scenario_where = f"scenarios.{scenario}.hyperparams"
        for key in shared:
            if key not in entry.hyperparams:
                problems = [line.replace(f"{where}.{key}:", f"{scenario_where}.{key}:") for line in problems]
        if problems:
            return problems
    if capabilities.k_param:
        # Uniform for every method with a number of clusters: K clusters need K clients.
        for scenario, sc in spec.scenarios.items():
            if not spec.runs_on(method, scenario):
                continue
            k = getattr(resolved_hyperparams(spec, scenario, method), capabilities.k_param)
            if k is not None and k > sc.participants:
                param = capabilities.k_param
                source = f"scenarios.{scenario}.hyperparams" \
                    if param in sc.hyperparams and param not in entry.hyperparams else where
                of = f" less its {sc.new_client_count()} new clients" if sc.new_clients is not None else ""
                return [f"{source}.{param}: must be <= clients of scenario {scenario}{of} "
                        f"({sc.participants}), got {k}"]
    for scenario, sc in spec.scenarios.items():
        if spec.runs_on(method, scenario):
            try:
                training = spec.resolved_training(scenario, method)
            except ValidationError:  # a training problem, which _check_training reports
                continue
            found = info.limit_errors(resolved_hyperparams(spec, scenario, method), training, sc)
            if found:
                key, text = found[0]
                return [f"{where}{'.' + key if key else ''}: {text} (scenario {scenario})"]
    if capabilities.needs_public:
        for scenario, sc in spec.scenarios.items():
            if spec.runs_on(method, scenario) and sc.public is None:
                return [f"{where}: {spec.method_type(method)} needs server-held public data, but scenario "
                        f"{scenario} has no `public:` (e.g. public: {{source: test, size: 500}} with pool: train)"]
    if capabilities.needs_groups:
        for scenario, sc in spec.scenarios.items():
            if spec.runs_on(method, scenario) and not sc.true_groups:
                return [f"{where}: {spec.method_type(method)} needs ground-truth groups, but scenario "
                        f"{scenario} has none; list the scenarios it should run on in {where}.scenarios"]
    return []


def spec_warnings(spec: Spec) -> list[str]:
    """Things a valid spec asks for that make a result meaningless without being an error: a
    clustered method whose clustering starts at or after the run's last round stays one cluster
    (FedAvg) throughout; a run that goes against a method's declared premises (a budget its
    clustering needs, a kind of group it cannot see). One line each, naming the key. Reads the
    methods' declarations (a plugin's module is imported, a built-in's is not)."""
    from cflpipe.data.base import dataset_info
    from cflpipe.registry import method_info, resolved_hyperparams

    lines = []
    for scenario, sc in spec.scenarios.items():
        info = dataset_info(sc.dataset.name)
        rounds = {m: spec.resolved_training(scenario, m).rounds for m in spec.methods if spec.runs_on(m, scenario)}
        if info.typical_rounds and rounds and 2 * min(rounds.values()) <= info.typical_rounds:
            fewest = min(rounds, key=rounds.get)
            lines.append(f"{training_key_path(spec, scenario, fewest, 'rounds')}: {rounds[fewest]} on scenario "
                         f"{scenario} is half or less of {info.name}'s typical budget of {info.typical_rounds} "
                         f"rounds ({info.typical_rounds_evidence}); its accuracies will be far from converged")
    for method in spec.methods:
        info = method_info(spec.method_type(method))
        premises: dict[tuple[str, str], list[str]] = {}  # one line per premise, its scenarios listed
        for scenario in spec.scenarios:
            if not spec.runs_on(method, scenario):
                continue
            hp = resolved_hyperparams(spec, scenario, method)
            training = spec.resolved_training(scenario, method)
            for found in info.premise_warnings(hp, training, spec.scenarios[scenario]):
                premises.setdefault(found, []).append(scenario)
            caps, clients = info.capabilities, spec.scenarios[scenario].participants
            # the tables of pairs evaluations write: of the clients full evaluations read
            evaluated = evaluated_clients(training, clients, bool(spec.scenarios[scenario].drift))
            if caps.pairs_round:
                clients = min(clients, training.clients_per_round)
            evaluations = sum(training.is_evaluated(r) for r in range(1, training.rounds + 1))
            held = clients ** 2 * caps.pair_bytes + evaluated ** 2 * evaluations * caps.pair_rows_bytes
            if caps.pair_bytes and held > machine_memory():
                lines.append(f"methods.{method}: on scenario {scenario} holds {caps.pairs}: about "
                             f"{held / 2 ** 30:,.1f} GiB for its {clients:,} clients{' a round' * caps.pairs_round}"
                             + (f" and {evaluations} evaluations" if caps.pair_rows_bytes else "")
                             + f", more than this machine's {machine_memory() / 2 ** 30:,.1f} GiB of memory; its "
                             f"paper needs all pairs: fewer clients, or a machine with more memory")
            start = info.clustering_starts(hp)
            rounds = training.rounds
            if start is not None and start[1] >= rounds:
                key, first = start
                value = getattr(hp, key)
                lines.append(f"methods.{method}.{key}: {value} leaves no round to cluster in the {rounds} rounds "
                             f"of scenario {scenario} (it may first cluster in round {first + 1}): {method} stays "
                             f"one cluster, FedAvg, throughout; lower it or raise training.rounds")
        for (key, text), scenarios in premises.items():
            where = ", ".join(scenarios[:3]) + (f" and {len(scenarios) - 3} more" if len(scenarios) > 3 else "")
            lines.append(f"methods.{method}{'.' + key if key else ''}: {text} (scenario{'s' * (len(scenarios) > 1)} "
                         f"{where})")
    return lines


def machine_memory() -> int:
    """Bytes of physical memory of this machine (what a run's N² matrices are weighed against)."""
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _check_scenario_hyperparams(spec: Spec) -> list[str]:
    """A scenario's `hyperparams` key that no method running on it takes, or that every such method
    overrides, would silently do nothing: an error, not a no-op."""
    from cflpipe.registry import method_info

    def info(name: str):
        try:  # unknown types and plugins that fail to load are reported by _check_method
            return method_info(spec.method_type(name))
        except (KeyError, SpecError):
            return None

    problems = []
    for scenario, sc in spec.scenarios.items():
        known: set[str] = set()
        used: set[str] = set()
        for name in spec.methods:
            if not spec.runs_on(name, scenario) or info(name) is None:
                continue
            has = set(info(name).params.model_fields)
            known |= has
            used |= has - set(spec.methods[name].hyperparams)
        for key in sc.hyperparams:
            if key not in known:
                problems.append(f"scenarios.{scenario}.hyperparams.{key}: no method of this scenario has this "
                                f"hyper-parameter; allowed: {', '.join(sorted(known)) or 'none'}")
            elif key not in used:
                problems.append(f"scenarios.{scenario}.hyperparams.{key}: every method of this scenario that has "
                                f"it sets its own value, so this one is never used; remove it")
    return problems


def _check_tuning(spec: Spec, data: dict, trials: bool = True) -> list[str]:
    """A tuning section's keys name what the method has, its scenarios hold validation data, and
    (with `trials`) every trial is a valid run (checked as the runs it is, the line pointed at the
    space's key)."""
    from cflpipe.registry import method_info
    from cflpipe.spec._tuning import ALL_METHODS, TUNABLE_TRAINING, MAX_TRIALS, grid_size

    tuning = spec.tuning
    if tuning is None:
        return []
    problems = []
    for method in spec.tuned_methods():
        own = tuning.space.get(method, {})
        try:  # an unknown type or a plugin that fails to load is _check_method's to report
            fields = set(method_info(spec.method_type(method)).params.model_fields)
        except (KeyError, SpecError):
            continue
        for key in tuning.keys_of(method):
            where = f"tuning.space.{method if key in own else ALL_METHODS}.{key}"
            if key in TRAINING_KEYS and key not in TUNABLE_TRAINING:
                problems.append(f"{where}: training.{key} is not tuned (it says what a run is or keeps, not how "
                                f"it learns); allowed training keys: {', '.join(TUNABLE_TRAINING)}")
            elif key in TUNABLE_TRAINING and key in fields:
                problems.append(f"{where}: both a training key and a hyper-parameter of {spec.method_type(method)}")
            elif key not in TUNABLE_TRAINING and key not in fields:
                problems.append(f"{where}: methods.{method} ({spec.method_type(method)}) has no hyper-parameter "
                                f"{key}; allowed: {', '.join([*TUNABLE_TRAINING, *sorted(fields)])}")
            elif key in spec.methods[method].hyperparams or key in spec.methods[method].training:
                entry = spec.method_entry(method)
                problems.append(f"{where}: methods.{entry} sets {key} itself{' (its sweep)' if entry != method else ''}; "
                                f"tuning would replace it in every run of the entry: tune it or set it, not both")
        keys = tuning.keys_of(method)
        if tuning.sampler == "grid" and grid_size(tuning, method) > MAX_TRIALS:
            problems.append(f"tuning.space: methods.{method}'s grid has {grid_size(tuning, method)} combinations; "
                            f"at most {MAX_TRIALS} (or sampler: random with a number of trials)")
        elif tuning.sampler == "random" and not any(isinstance(v, dict) for v in keys.values()) \
                and grid_size(tuning, method) < (tuning.trials or 0):
            problems.append(f"tuning.trials: {tuning.trials} draws of the {grid_size(tuning, method)} combinations "
                            f"of methods.{method}'s space; use sampler: grid, or fewer trials")
        elif tuning.sampler == "random" and len(spec.trials(method)) < (tuning.trials or 0):
            problems.append(f"tuning.trials: {tuning.trials} draws give only {len(spec.trials(method))} distinct "
                            f"trials of methods.{method} (sampled values keep 3 significant digits); widen its "
                            f"ranges or ask fewer trials")
        for scenario, sc in spec.scenarios.items():
            if spec.runs_on(method, scenario) and sc.validation_fraction == 0:
                problems.append(f"scenarios.{scenario}.validation_fraction: 0, but methods.{method} is tuned on it "
                                f"(tuning.space): tuning selects on validation data, never on test data; give it "
                                f"a share of the training data, e.g. 0.2")
    if problems or not trials:
        return list(dict.fromkeys(problems))
    view = spec.tuning_spec()
    for method in spec.tuned_methods():
        own = tuning.space.get(method, {})
        for trial in spec.trials(method):
            name = spec.trial_entry(method, trial.name)
            lines = _check_method(view, name)
            for scenario in spec.scenarios:
                if spec.runs_on(method, scenario):
                    lines += _check_training(view, data, scenario, name)
            for line in lines:
                path, _, message = line.partition(": ")
                key = path.rsplit(".", 1)[-1]
                if path.startswith(f"methods.{name}") and key in trial.values:
                    path = f"tuning.space.{method if key in own else ALL_METHODS}.{key}"
                elif path == f"methods.{name}.training":  # a rule across the trial's training keys
                    path = f"tuning.space.{method if set(trial.training) & set(own) else ALL_METHODS}"
                problems.append(f"{path}: {message} (trial {trial.name} of methods.{method})")
            if problems:
                return problems
    return []


def _tuning_space_of_sweeps(data: dict, origins: dict) -> dict:
    """`tuning.space` may name a `sweep:` entry: its keys then apply to every entry it expands into."""
    tuning = data.get("tuning")
    space = tuning.get("space") if isinstance(tuning, dict) else None
    swept = {o.entry for o in origins.values()}
    if not isinstance(space, dict) or not swept & set(space):
        return data
    expanded: dict[Any, Any] = {}
    for name, keys in space.items():
        if name in swept:
            for new_name, origin in origins.items():
                if origin.entry == name:
                    # an entry of its own, if given too, wins key by key; a malformed value is Spec's to report
                    expanded[new_name] = {**keys, **space.get(new_name, {})} if isinstance(keys, dict) else keys
        elif name not in expanded:
            expanded[name] = keys
    return {**data, "tuning": {**tuning, "space": expanded}}
