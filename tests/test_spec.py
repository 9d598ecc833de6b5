"""The spec: valid files load, and every bad value gives one line naming path, value and rule."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cflpipe.errors import SpecError
from cflpipe.spec import load_spec, parse_spec, spec_sha256

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "seeds": [0, 1],
    "training": {"model": "cnn", "rounds": 4, "clients_per_round": 4},
    "scenarios": {
        "digits-swap4": {
            "dataset": "digits", "clients": 8,
            "partition": [{"kind": "dirichlet", "alpha": 0.5}, {"kind": "label_swap", "groups": 4}],
        }
    },
    "methods": {"fedavg": {}, "prox": {"method": "fedprox", "mu": 0.1}},
}


def with_change(path: str, value):
    """Copy of BASE with the value at a dotted path (list indices as ints) replaced."""
    data = yaml.safe_load(yaml.safe_dump(BASE))
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = data
    for key in keys[:-1]:
        node = node[key]
    if value is DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return data


DELETE = object()


def error_of(data) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return str(info.value)


def test_default_config_is_valid():
    spec = load_spec(ROOT / "config" / "config.yaml")
    assert spec.matrix()
    for scenario, method, seed in spec.matrix():
        assert spec.runs_on(method, scenario)


def test_base_spec_resolves_overrides():
    data = with_change("methods.prox.training", {"lr": 0.2})
    data["scenarios"]["digits-swap4"]["training"] = {"rounds": 7, "lr": 0.1}
    spec = parse_spec(data)
    assert spec.resolved_training("digits-swap4", "prox").lr == 0.2
    assert spec.resolved_training("digits-swap4", "prox").rounds == 7
    assert spec.resolved_training("digits-swap4", "fedavg").lr == 0.1
    assert spec.method_type("prox") == "fedprox"
    assert len(spec.matrix()) == 4


@pytest.mark.parametrize("path, value, expected", [
    ("scenarios.digits-swap4.partition.0.alpha", -1,
     "scenarios.digits-swap4.partition[0].alpha: must be > 0, got -1"),
    ("scenarios.digits-swap4.test_fraction", 1.5,
     "scenarios.digits-swap4.test_fraction: must be < 1, got 1.5"),
    ("scenarios.digits-swap4.test_fraction", 0,
     "scenarios.digits-swap4.test_fraction: must be > 0, got 0"),
    ("training.rounds", 0, "training.rounds: must be >= 1, got 0"),
    ("training.colour", "red", "training.colour: unknown key, got 'red'"),
    ("training.device", "tpu", "training.device: must be one of 'auto', 'cpu' or 'cuda', got 'tpu'"),
    ("scenarios.digits-swap4.partition.0.kind", "zipf", "scenarios.digits-swap4.partition[0].kind: must be one of 'iid', 'dirichlet'"),
    ("scenarios.digits-swap4.partition.1.groups", 9,
     "scenarios.digits-swap4: partition[1].groups: must be <= clients (8), got 9"),
    ("scenarios.digits-swap4.dataset", "imagenet", "scenarios.digits-swap4.dataset: unknown dataset 'imagenet'"),
    ("scenarios.digits-swap4.clients", DELETE, "scenarios.digits-swap4.clients: is required"),
    ("methods.prox.mu", -3, "methods.prox.mu: must be >= 0, got -3"),
    ("methods.prox.nu", 1, "methods.prox.nu: unknown key, got 1"),
    ("methods.prox.method", "magic", "methods.prox.method: unknown method 'magic'; allowed:"),
    ("methods.prox.training", {"lr": -1}, "methods.prox.training.lr: must be > 0, got -1"),
    ("methods.prox.training", {"speed": 1}, "methods.prox.training.speed: unknown key; allowed:"),
    ("training.clients_per_round", 9, "training.clients_per_round: must be <= clients of scenario digits-swap4 (8), got 9"),
    ("seeds", [1, 1], "seeds: seeds must be distinct, got [1, 1]"),
])
def test_bad_values_name_path_value_and_rule(path, value, expected):
    message = error_of(with_change(path, value))
    assert expected in message
    assert message.count("\n") == 0


def test_names_must_be_path_safe():
    data = with_change("methods", {"Fed Avg": {}})
    assert "methods: name 'Fed Avg' must match [a-z0-9_][a-z0-9_-]*" in error_of(data)


def test_oracle_needs_groups():
    data = with_change("methods", {"oracle": {}})
    data["scenarios"]["plain"] = {"dataset": "digits", "clients": 8}
    assert "methods.oracle: oracle needs ground-truth groups, but scenario plain has none" in error_of(data)
    data["methods"]["oracle"] = {"scenarios": ["digits-swap4"]}
    parse_spec(data)


def test_dataset_params_are_validated():
    data = with_change("scenarios.digits-swap4.dataset", {"name": "synthetic", "alpha": -1})
    assert "scenarios.digits-swap4.dataset.alpha: must be >= 0, got -1" in error_of(data)


def test_cli_validate_reports_one_line_and_exit_code(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_change("scenarios.digits-swap4.partition.0.alpha", -1)))
    proc = subprocess.run([sys.executable, "-m", "cflpipe", "validate", "--config", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: scenarios.digits-swap4.partition[0].alpha: must be > 0, got -1"
    assert proc.stdout == ""


def test_cli_invalid_yaml_and_missing_file(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("seeds: [0, 1\nmethods: {")
    proc = subprocess.run([sys.executable, "-m", "cflpipe", "validate", "--config", str(broken)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "line" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = subprocess.run([sys.executable, "-m", "cflpipe", "validate", "--config", str(tmp_path / "nope.yaml")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


@pytest.mark.parametrize("path", sorted((ROOT / "config" / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_paper_experiment_specs_are_valid(path):
    spec = load_spec(path)
    assert spec.matrix()


def test_local_epochs_override_replaces_the_default_local_steps():
    data = with_change("scenarios.digits-swap4.training", {"local_epochs": 2})
    data["methods"]["prox"]["training"] = {"local_steps": 3}
    spec = parse_spec(data)
    fedavg = spec.resolved_training("digits-swap4", "fedavg")
    assert (fedavg.local_steps, fedavg.local_epochs) == (None, 2)
    prox = spec.resolved_training("digits-swap4", "prox")
    assert (prox.local_steps, prox.local_epochs) == (3, None)


def test_model_names_are_checked_by_validate_and_match_the_registry():
    from cflpipe.models import BUILTIN_MODELS
    from cflpipe.plugins import MODELS_GROUP, entry_point_names
    from cflpipe.spec import MODEL_NAMES

    assert MODEL_NAMES == BUILTIN_MODELS
    plugins = "".join(f", {name!r}" for name in entry_point_names(MODELS_GROUP))  # installed plugins' models
    message = error_of(with_change("training.model", "vgg"))
    assert message == (f"training.model: must be one of 'mlp', 'cnn', 'cnn_tsdp', 'cnn_pfl', 'resnet18'{plugins}, mlp<d> (an "
                       f"MLP of d = 2…64 linear layers, e.g. mlp11) or a module:Class reference, got 'vgg'")
    # an override of a scenario or a method entry: one line for the one mistake
    for path in ("scenarios.digits-swap4.training", "methods.prox.training"):
        message = error_of(with_change(path, {"model": "nope"}))
        assert message == (f"{path}.model: must be one of 'mlp', 'cnn', 'cnn_tsdp', 'cnn_pfl', 'resnet18'{plugins}, mlp<d> (an "
                           f"MLP of d = 2…64 linear layers, e.g. mlp11) or a module:Class reference, got 'nope'")


def test_em_methods_need_no_more_clusters_than_clients():
    data = with_change("methods", {"fesem": {"clusters": 9}})
    assert error_of(data) == "methods.fesem.clusters: must be <= clients of scenario digits-swap4 (8), got 9"


def test_image_models_need_image_datasets():
    data = with_change("scenarios.digits-swap4.dataset", {"name": "synthetic", "devices": 8})
    data["scenarios"]["digits-swap4"]["partition"] = [{"kind": "natural"}]
    assert error_of(data) == ("training.model: cnn needs images, but scenario digits-swap4's dataset "
                              "synthetic has feature vectors; use mlp")


@pytest.mark.parametrize("report, line", [
    ({"tables": [{"figure": "acc", "title": "x"}]},
     "report.tables[0].figure: must be one of 'acc_macro', 'acc_micro', 'acc_worst10', 'global_acc_mean', "
     "'f1_macro', 'f1_micro', 'ari', 'nmi', 'n_clusters', 'intra_acc', 'inter_acc', 'mixture_error', 'bytes_down_total', "
     "'bytes_up_total', 'bytes_total' or 'seconds_per_round', got 'acc'"),
    ({"tables": []}, "report.tables: must not be empty, got []"),
    ({"table": 1}, "report.table: unknown key, got 1; allowed: tables"),
])
def test_report_tables_are_checked(report, line):
    raw = {"scenarios": {"s": {"dataset": "digits", "clients": 4, "partition": [{"kind": "iid"}]}},
           "methods": {"fedavg": {}}, "report": report}
    with pytest.raises(SpecError) as error:
        parse_spec(raw)
    assert str(error.value) == line


@pytest.mark.parametrize("workflow, line", [
    ({"train_jobs": "seed"}, "workflow.train_jobs: must be one of 'scenario' or 'method', got 'seed'"),
    ({"jobs": 2}, "workflow.jobs: unknown key, got 2; allowed: train_jobs, live"),
])
def test_workflow_options_are_checked_and_leave_the_experiment_alone(workflow, line):
    raw = {"scenarios": {"s": {"dataset": "digits", "clients": 10, "partition": [{"kind": "iid"}]}},
           "methods": {"fedavg": {}}}
    with pytest.raises(SpecError) as error:
        parse_spec({**raw, "workflow": workflow})
    assert str(error.value) == line
    # how runs are cut into jobs is no part of what they are
    assert parse_spec(raw).workflow.train_jobs == "scenario"
    for options in ({"train_jobs": "method"}, {"live": True}):
        assert spec_sha256(parse_spec({**raw, "workflow": options})) == spec_sha256(parse_spec(raw))


def test_label_swap_pairs_must_fit_the_classes(tmp_path):
    from cflpipe.fl.data import partition_scenario

    raw = {"scenarios": {"s": {"dataset": "digits", "clients": 4,
                               "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2, "pairs": 6}]}},
           "methods": {"fedavg": {}}, "training": {"clients_per_round": 4},
           "results_dir": str(tmp_path / "r"), "data_dir": str(tmp_path / "d")}
    from cflpipe.errors import PartitionError

    with pytest.raises(PartitionError) as error:
        partition_scenario(parse_spec(raw), "s")
    assert str(error.value) == ("scenarios.s.partition[1].pairs: dataset digits has 10 classes, so at most "
                                "5 disjoint label pairs, got 6")


# ---------------------------------------------------------------------- hardening (issue #16)


@pytest.mark.parametrize("path, value", [
    ("training.lr", float("inf")),
    ("methods.prox.mu", float("inf")),
    ("scenarios.digits-swap4.partition.0.alpha", float("inf")),
    ("scenarios.digits-swap4.test_fraction", float("nan")),
    ("methods.fedavg.training", {"momentum": float("-inf")}),
])
def test_non_finite_numbers_are_rejected_where_they_are(path, value):
    message = error_of(with_change(path, value))
    if isinstance(value, dict):
        (key, value), = value.items()
        path = f"{path}.{key}"
    assert message == f"{path.replace('.0.', '[0].')}: must be a finite number, got {value}"


def test_non_finite_dataset_and_rotation_parameters_are_rejected(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("seeds: [0]\nmethods: {fedavg: {}}\nscenarios:\n"
                    "  s: {dataset: {name: synthetic, alpha: .inf}, clients: 4,\n"
                    "      partition: [{kind: rotation, groups: 2, angles: [0, .nan]}]}\n")
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    assert str(info.value).splitlines() == ["scenarios.s.dataset.alpha: must be a finite number, got inf",
                                            "scenarios.s.partition[0].angles[1]: must be a finite number, got nan"]


@pytest.mark.parametrize("levels,kind", [(9, "list"), (7, "mapping")])
def test_alias_bombs_and_cycles_are_refused_in_one_line_at_once(tmp_path, levels, kind):
    """Billion laughs: each level repeats the previous one nine times by alias (9^9 ≈ 3.9·10^8
    values); every walk of the expanded tree would hang (as this test would), so the size is
    counted once per node."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        items = ", ".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{items}]" if kind == "list" else
                     f"a{level}: &a{level} {{{', '.join(f'k{i}: *a{level - 1}' for i in range(9))}}}")
    lines.append("seeds: [0]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecError) as info:
        load_spec(bomb)
    assert str(info.value) == ("spec: its YAML aliases expand it to more than 1,000,000 values (an alias bomb?); "
                               "write the values out, or use fewer nested aliases")
    cycle = tmp_path / "cycle.yaml"
    cycle.write_text("seeds: &s [0, *s]\n")
    with pytest.raises(SpecError, match=r"^spec: a YAML alias refers to a mapping or list that contains it"):
        load_spec(cycle)
    # aliases that expand modestly are a spec's business
    fine = tmp_path / "fine.yaml"
    fine.write_text("training: &t {model: mlp, rounds: 2, clients_per_round: 2}\nseeds: [0]\n"
                    "scenarios: {s: {dataset: digits, clients: 4, training: *t}}\nmethods: {fedavg: {}}\n")
    assert load_spec(fine).scenarios["s"].clients == 4


def test_duplicate_yaml_keys_are_rejected_with_their_lines(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("seeds: [0]\nmethods: {fedavg: {}}\nscenarios:\n  s: {dataset: digits, clients: 4}\n"
                    "methods: {ifca: {}}\n")
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    assert str(info.value) == f"{spec}: duplicate key 'methods' at line 5 (first at line 2); each key may appear once"
    nested = tmp_path / "nested.yaml"
    nested.write_text("seeds: [0]\nmethods: {fedavg: {}}\nscenarios:\n  s:\n    dataset: digits\n    clients: 4\n"
                      "    clients: 8\n")
    with pytest.raises(SpecError, match="duplicate key 'clients' at line 7 \\(first at line 6\\)"):
        load_spec(nested)
    anchors = tmp_path / "anchors.yaml"  # merge keys are still fine, and a mapping may override them
    anchors.write_text("seeds: [0]\nmethods: {fedavg: {}}\ntraining: {clients_per_round: 2}\n"
                       "scenarios:\n  a: &b {dataset: digits, clients: 4}\n  s: {<<: *b, clients: 8}\n")
    assert load_spec(anchors).scenarios["s"].clients == 8
    twice = tmp_path / "twice.yaml"
    twice.write_text("seeds: [0]\nmethods: {fedavg: {}}\nscenarios:\n  a: &b {dataset: digits, clients: 4}\n"
                     "  s: {<<: *b, clients: 8, clients: 9}\n")
    with pytest.raises(SpecError, match="duplicate key 'clients' at line 5"):
        load_spec(twice)


def test_exponent_floats_are_numbers(tmp_path):
    """YAML 1.1 (PyYAML) reads 1e-3 as a string; specs read it as YAML 1.2 does."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("seeds: [0]\nmethods: {fedavg: {}}\nscenarios: {s: {dataset: digits, clients: 4}}\n"
                    "training: {clients_per_round: 2, lr: 1e-2, weight_decay: 5E-4, momentum: .5}\n")
    training = load_spec(spec).training
    assert (training.lr, training.weight_decay, training.momentum) == (0.01, 0.0005, 0.5)


@pytest.mark.parametrize("name", ["s1\n", "-s", "S", "a b", ""])
def test_names_must_match_fully_and_not_start_with_a_dash(name):
    data = with_change("scenarios", {name: BASE["scenarios"]["digits-swap4"]})
    assert "must match [a-z0-9_][a-z0-9_-]*" in error_of(data)


def test_binary_and_deeply_nested_specs_are_one_line(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00seeds")
    with pytest.raises(SpecError) as info:
        load_spec(binary)
    assert str(info.value) == f"{binary}: not UTF-8 text (byte 0xff at offset 0); a spec is a YAML text file"
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 100000 + "]" * 100000 + "\n")
    with pytest.raises(SpecError) as info:
        load_spec(deep)
    assert str(info.value) == f"{deep}: nested too deeply to be a spec"


@pytest.mark.parametrize("seed", [2**63, 10**20])
def test_seeds_beyond_torchs_range_are_rejected(seed):
    assert "must lie in [0, 9223372036854775807]" in error_of(with_change("seeds", [seed]))


@pytest.mark.parametrize("path, value, line", [
    ("scenarios.digits-swap4.clients", True, "scenarios.digits-swap4.clients: must be an integer, got true"),
    ("training.rounds", "5", "training.rounds: must be an integer, got '5'"),
    ("training.rounds", 10**7, "training.rounds: must be <= 1000000, got 10000000"),
    ("results_dir", "", "results_dir: must not be empty, got ''"),
    ("methods.prox.bogus", 1, "methods.prox.bogus: unknown key, got 1; allowed: mu"),
    ("scenarios.digits-swap4.partition.1.bogus", 1,
     "scenarios.digits-swap4.partition[1].bogus: unknown key, got 1; allowed: kind, groups, pairs, ground_truth"),
])
def test_strict_types_bounds_and_allowed_keys(path, value, line):
    assert error_of(with_change(path, value)) == line


def test_cross_field_and_size_limits(tmp_path):
    data = with_change("methods.fedac", {"cnt_low": 0.9, "cnt_high": 0.5})
    assert error_of(data) == "methods.fedac: cnt_low (0.9) must be <= cnt_high (0.5): G < cnt_low merges, " \
                             "G > cnt_high splits"
    big = tmp_path / "big.yaml"
    big.write_text("seeds: [0]\n" + "#" * (1 << 20))
    with pytest.raises(SpecError) as info:
        load_spec(big)
    assert str(info.value) == f"{big}: {big.stat().st_size} bytes; a spec is at most 1048576 bytes (1 MiB)"


def test_scenario_hyperparams_give_k_per_scenario_and_the_method_entry_wins():
    """`scenarios.S.hyperparams` (e.g. K = the scenario's true groups) reaches every method of the
    scenario that has the key, a method entry's own value overrides it, and the partition's
    fingerprint does not depend on it."""
    from cflpipe.fl.runs import resolved_config
    from cflpipe.registry import resolved_hyperparams

    data = with_change("methods", {"fedavg": {}, "ifca": {}, "fixed": {"method": "ifca", "clusters": 3},
                                   "prox": {"method": "fedprox", "mu": 0.1}})
    plain = parse_spec(data)
    data["scenarios"]["digits-swap4"]["hyperparams"] = {"clusters": 4}
    spec = parse_spec(data)
    assert resolved_hyperparams(spec, "digits-swap4", "ifca").clusters == 4
    assert resolved_hyperparams(plain, "digits-swap4", "ifca").clusters == 2  # IFCA's default
    assert resolved_hyperparams(spec, "digits-swap4", "fixed").clusters == 3
    assert resolved_hyperparams(spec, "digits-swap4", "prox").model_dump() == {"mu": 0.1}
    assert resolved_config(spec, "digits-swap4", "ifca", 0)["hyperparams"]["clusters"] == 4
    assert spec.scenarios["digits-swap4"].definition() == plain.scenarios["digits-swap4"].definition()


@pytest.mark.parametrize("hyperparams, line", [
    ({"clustres": 4}, "scenarios.digits-swap4.hyperparams.clustres: no method of this scenario has this "
                      "hyper-parameter; allowed: clusters, mu, restart_rounds, restarts"),
    ({"clusters": 0}, "scenarios.digits-swap4.hyperparams.clusters: must be >= 1, got 0"),
    ({"clusters": 9}, "scenarios.digits-swap4.hyperparams.clusters: must be <= clients of scenario "
                      "digits-swap4 (8), got 9"),
])
def test_scenario_hyperparams_are_checked_where_they_are_written(hyperparams, line):
    data = with_change("methods", {"ifca": {}, "prox": {"method": "fedprox", "mu": 0.1}})
    data["scenarios"]["digits-swap4"]["hyperparams"] = hyperparams
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert str(err.value).splitlines() == [line]


@pytest.mark.parametrize("hyperparams, methods, line", [
    # checked together with the method entry's values: rules spanning two keys hold
    ({"thresholds": "relative"}, {"cfl": {"warmup": 0}},
     "methods.cfl: thresholds: relative measures its scale in the warm-up rounds, so warmup must be >= 1"),
    ({"lam": 30}, {"cgpfl": {"personal_lr": 0.1, "clusters": 2}},
     "methods.cgpfl: personal_lr·lam must be < 2 for the inner solver to converge, got 0.1·30.0 = 3"),
    # a value every method overrides is never used
    ({"mu": 0.0}, {"fedprox": {"mu": 0.1}, "ifca": {}},
     "scenarios.digits-swap4.hyperparams.mu: every method of this scenario that has it sets its own value, "
     "so this one is never used; remove it"),
    # a method's own default K that is too large is the method's line, not the scenario's
    ({}, {"fcca": {}}, "methods.fcca.clusters: must be <= clients of scenario digits-swap4 (4), got 5"),
    # a method restricted to other scenarios does not see this scenario's values
    ({"clusters": 3}, {"ifca": {}, "other": {"method": "ifca", "clusters": 5, "scenarios": ["s2"]}}, None),
])
def test_scenario_hyperparams_with_method_entries(hyperparams, methods, line):
    data = with_change("methods", methods)
    data["scenarios"]["s2"] = {"dataset": "digits", "clients": 8}
    data["scenarios"]["digits-swap4"].update(clients=4, hyperparams=hyperparams)
    data["training"]["clients_per_round"] = 4
    if line is None:
        from cflpipe.registry import resolved_hyperparams

        spec = parse_spec(data)
        assert resolved_hyperparams(spec, "digits-swap4", "ifca").clusters == 3
        assert resolved_hyperparams(spec, "s2", "other").clusters == 5
        return
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert str(err.value).splitlines() == [line]


def test_validate_reports_structural_and_cross_field_errors_in_one_pass():
    """A misspelt kind no longer hides the scenario's two label splits or a clients_per_round
    above its clients: one `validate` names all of them."""
    raw = {"seeds": 3, "training": {"model": "mlp", "rounds": 2, "clients_per_round": 50},
           "scenarios": {"a": {"dataset": "digits", "clients": 6,
                               "partition": [{"kind": "dirichlet", "alpha": 1.0},
                                             {"kind": "pathological", "labels_per_client": 2},
                                             {"kind": "label_swapp", "groups": 2}]}},
           "methods": {"fedavg": {}}}
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    lines = str(err.value).splitlines()
    assert "seeds: must be a list, got 3" in lines
    assert any(line.startswith("scenarios.a.partition[2].kind: must be one of") for line in lines)
    assert "scenarios.a: partition has more than one label split (dirichlet, pathological); use one of iid, " \
           "dirichlet, pathological, natural" in lines
    assert "training.clients_per_round: must be <= clients of scenario a (6), got 50" in lines
    assert len(lines) == len(set(lines))


def test_validate_checks_the_valid_scenarios_and_methods_of_an_invalid_spec_too():
    """A bad scenario entry does not hide a K above another scenario's clients, an unknown
    hyper-parameter of a method, or a drift round past the runs' last; nothing is said of the
    entry left out, nor of a method whose only scenario it was."""
    raw = {"seeds": 3, "training": {"model": "mlp", "rounds": 4, "clients_per_round": 3},
           "scenarios": {"bad": {"dataset": "digits", "clients": 6, "partition": [{"kind": "iidd"}]},
                         "c": {"dataset": "digits", "clients": 6, "hyperparams": {"clusters": 20},
                               "drift": [{"round": 9, "fraction": 0.5}],
                               "partition": [{"kind": "iid"}, {"kind": "rotation", "groups": 2}]}},
           "methods": {"ifca": {}, "fedavg": {"mu": 1}, "cfl": {"scenarios": ["bad"]}}}
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    lines = str(err.value).splitlines()
    assert lines[0] == "seeds: must be a list, got 3"
    assert any(line.startswith("scenarios.bad.partition[0].kind: must be one of") for line in lines)
    assert "scenarios.c.hyperparams.clusters: must be <= clients of scenario c (6), got 20" in lines
    assert any(line.startswith("methods.fedavg.mu: unknown key") for line in lines)
    assert any(line.startswith("scenarios.c.drift[0].round: must be <= the rounds of its runs") for line in lines)
    assert not any("cfl" in line for line in lines) and len(lines) == len(set(lines)) == 5


def test_validate_keeps_the_files_positions_and_says_nothing_of_what_it_left_out():
    raw = {"seeds": [0], "training": {"model": "mlp", "rounds": 4, "clients_per_round": 3},
           "scenarios": {"bad": {"dataset": "digits", "clients": 6, "partition": [{"kind": "iidd"}]},
                         "c": {"dataset": "digits", "clients": 6, "hyperparams": {"clusters": 2},
                               "partition": [{"kind": "iid"}, {"kind": "rotation", "groups": 2}]}},
           "methods": {"ifca": {"label": 3}, "fedavg": {"scenarios": ["bad", "nope", "c"]}}}
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    lines = str(err.value).splitlines()
    assert "methods.fedavg.scenarios[1]: unknown scenario 'nope'; allowed: c" in lines, lines
    # clusters is IFCA's, left out for its bad label: not "no method has this hyper-parameter"
    assert not any(line.startswith("scenarios.c.hyperparams") for line in lines), lines


def test_set_overrides_keys_of_the_spec_and_is_checked_as_the_spec(tmp_path):
    """`--set KEY=VALUE`: dotted keys into the spec, YAML values, in order; what they make is
    validated as the file is, and a malformed one is one line naming it."""
    from cflpipe.spec import apply_overrides

    data = {"seeds": [0], "training": {"rounds": 5}, "scenarios": {"a-b": {"clients": 4}}}
    out = apply_overrides(data, ["training.rounds=2", "seeds=[0, 1]", "scenarios.a-b.clients=8",
                                 "training.lr=1e-3", "report.tables=[]", "training.rounds=3"])
    assert out == {"seeds": [0, 1], "training": {"rounds": 3, "lr": 0.001}, "scenarios": {"a-b": {"clients": 8}},
                   "report": {"tables": []}}
    assert data["training"] == {"rounds": 5}  # the file's data is not changed
    for item, line in [("training.rounds", "--set: 'training.rounds' is not KEY=VALUE"),
                       ("=5", "--set: '=5' is not KEY=VALUE"),
                       ("training..rounds=5", "--set: 'training..rounds=5' is not KEY=VALUE"),
                       ("training.rounds=[", "--set training.rounds: '[' is not a YAML value"),
                       ("training.rounds.x=1", "--set training.rounds.x: training.rounds is 5 in the spec, not a "
                                               "mapping")]:
        with pytest.raises(SpecError) as err:
            apply_overrides(data, [item])
        assert str(err.value).startswith(line), str(err.value)


def test_set_on_the_command_line_changes_the_runs_and_validate_checks_it(tmp_path):
    import subprocess
    import sys

    import yaml

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"seeds": [0], "results_dir": str(tmp_path / "r"),
                                    "training": {"model": "mlp", "rounds": 3, "clients_per_round": 2},
                                    "scenarios": {"s": {"dataset": "digits", "clients": 4}},
                                    "methods": {"fedavg": {}}}))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "cflpipe", *args], capture_output=True, text=True)

    ok = cli("validate", "--config", str(spec), "--set", "training.rounds=1", "--set", "seeds=[0,1]")
    assert ok.returncode == 0 and "(2 runs: 1 scenario, 1 method, 2 seeds;" in ok.stdout, ok.stdout + ok.stderr
    bad = cli("validate", "--config", str(spec), "--set", "training.rounds=0")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: training.rounds: must be >= 1, got 0"
    assert cli("partition", "--config", str(spec), "--scenario", "s").returncode == 0
    trained = cli("train", "--config", str(spec), "--set", "training.rounds=1", "--scenario", "s", "--method",
                  "fedavg", "--seed", "0", "--quiet")
    assert trained.returncode == 0, trained.stderr
    config = yaml.safe_load((tmp_path / "r/runs/s/fedavg/seed0/config.yaml").read_text())
    assert config["training"]["rounds"] == 1
