"""Tuning as a spec section (#44 item 2): trials on tuning seeds, a selection on validation data
only, final seeds with the chosen values; bad sections refused in one line; reruns and resumes
byte-identical."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cflpipe import cli
from cflpipe.errors import SpecError
from cflpipe.fl import runs
from cflpipe.spec import parse_spec
from cflpipe.spec._tuning import expand_trials
from cflpipe.tuning import TRIAL_FILE

from conftest import die_after_saving, other_test_data


def spec_dict(results: Path, data_dir: Path | None = None, **tuning) -> dict:
    return {
        "seeds": [0],
        "protocol": "tuned",
        "training": {"model": "mlp", "rounds": 4, "clients_per_round": 4, "local_steps": 3, "batch_size": 16,
                     "lr": 0.05, "eval_every": 2, "checkpoint_every": 1, "device": "cpu"},
        "scenarios": {"s": {"dataset": "digits", "clients": 8, "validation_fraction": 0.25,
                            "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
        "methods": {"fedavg": {}, "fedprox": {}},
        "tuning": {"seeds": [10, 11], "space": {"all": {"lr": [0.02, 0.2]}, "fedprox": {"mu": [0.001, 0.1]}},
                   **tuning},
        "results_dir": str(results), "data_dir": str(data_dir or results.parent / "data"),
    }


def write_spec(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def tune_all(config: str, methods=("fedavg", "fedprox")) -> None:
    for method in methods:
        assert cli.main(["tune", "--config", config, "--scenario", "s", "--method", method, "--quiet"]) == 0
    assert cli.main(["tune-select", "--config", config]) == 0


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under a folder but the wall-clock ones, checkpoints and their locks."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in ("timing.json", "timing.parquet", ".lock") and "state" not in p.parts}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One tuned spec, its trials selected and its final runs trained."""
    root = tmp_path_factory.mktemp("tuned")
    config = write_spec(root / "spec.yaml", spec_dict(root / "results"))
    tune_all(config)
    assert cli.main(["train", "--config", config, "--scenario", "s", "--method", "fedavg", "fedprox",
                     "--seed", "0", "--quiet"]) == 0
    return root, config


def test_trials_are_the_grid_in_the_order_written_named_by_their_values():
    spec = parse_spec(spec_dict(Path("/tmp/unused")))
    assert [t.name for t in spec.trials("fedavg")] == ["lr0p02", "lr0p2"]
    assert [t.values for t in spec.trials("fedprox")] == [{"lr": 0.02, "mu": 0.001}, {"lr": 0.02, "mu": 0.1},
                                                          {"lr": 0.2, "mu": 0.001}, {"lr": 0.2, "mu": 0.1}]
    trial = spec.trials("fedprox")[1]
    assert trial.training == {"lr": 0.02} and trial.hyperparams == {"mu": 0.1}
    assert len(spec.tuning_matrix()) == (2 + 4) * 2  # trials × tuning seeds on the one scenario


def test_random_trials_are_seeded_and_a_larger_budget_keeps_the_earlier_draws():
    def trials(**kwargs):
        data = spec_dict(Path("/tmp/unused"), sampler="random", **kwargs)
        data["tuning"]["space"] = {"all": {"lr": {"low": 0.001, "high": 0.5, "log": True}}}
        return expand_trials(parse_spec(data).tuning, "fedavg")

    three, five = trials(trials=3), trials(trials=5)
    assert five[:3] == three and len({t.name for t in five}) == 5
    assert trials(trials=3) == three  # the same draws again
    assert trials(trials=3, sampler_seed=1) != three
    for t in five:
        lr = t.values["lr"]
        assert 0.001 <= lr <= 0.5 and float(f"{lr:.3g}") == lr  # three significant digits


BAD_TUNING = [
    ({"seeds": [0]}, "tuning.seeds: 0 is also a final seed"),
    ({"space": {"ifca": {"lr": [0.1]}}}, "tuning.space.ifca: not a method entry; allowed: all, fedavg, fedprox"),
    ({"space": {"all": {"rounds": [2, 4]}}}, "tuning.space.all.rounds: training.rounds is not tuned"),
    ({"space": {"all": {"mu": [0.1, 1]}}}, "tuning.space.all.mu: methods.fedavg (fedavg) has no hyper-parameter mu"),
    ({"space": {"all": {"lr": {"low": 0.01, "high": 0.1}}}}, "tuning.space.all.lr: a range is sampled"),
    ({"sampler": "random"}, "tuning.trials: the random sampler needs a number of trials"),
    ({"sampler": "random", "trials": 3}, "tuning.trials: 3 draws of the 2 combinations of methods.fedavg"),
    ({"trials": 3}, "tuning.trials: a grid runs every combination"),
    ({"space": {"all": {"lr": [0.1, 0.1]}}}, "tuning.space.all.lr: values must be distinct"),
    ({"space": {"all": {"lr": [-0.1, 0.1]}}}, "tuning.space.all.lr: must be > 0, got -0.1 (trial lrm0p1 of methods.fedavg)"),
    ({"space": {"fedprox": {"mu": [-1.0]}}}, "tuning.space.fedprox.mu:"),
    ({"select": "first"}, "tuning.select:"),
    ({"space": {"all": {"local_steps": [2], "local_epochs": [1.0]}}},
     "tuning.space.all: give exactly one of local_steps and local_epochs (trial local_steps2-local_epochs1p0"),
]


@pytest.mark.parametrize("change, line", BAD_TUNING, ids=[line.split(":")[0] + str(i) for i, (_, line) in
                                                        enumerate(BAD_TUNING)])
def test_a_bad_tuning_section_is_refused_in_one_line(change, line):
    data = spec_dict(Path("/tmp/unused"))
    data["tuning"] = {**data["tuning"], **change}
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert len(str(err.value).splitlines()) == 1, str(err.value)
    assert line in str(err.value)


@pytest.mark.parametrize("change, line", [
    (lambda d: d["scenarios"]["s"].pop("validation_fraction"),
     "scenarios.s.validation_fraction: 0, but methods.fedavg is tuned on it"),
    (lambda d: d.pop("tuning"), "protocol: 'tuned' needs a tuning: section"),
    (lambda d: d.update(protocol="paper"), "protocol: 'paper', but the spec has a tuning: section"),
])
def test_tuning_needs_validation_data_and_a_matching_protocol(change, line):
    data = spec_dict(Path("/tmp/unused"))
    change(data)
    with pytest.raises(SpecError, match="^" + line.replace("(", r"\(").replace(")", r"\)")):
        parse_spec(data)


def test_the_final_runs_train_with_the_values_their_selection_chose(tuned):
    root, config = tuned
    spec = parse_spec(yaml.safe_load(Path(config).read_text()))
    for method in ("fedavg", "fedprox"):
        chosen = json.loads(spec.chosen_path("s", method).read_text())
        trials = chosen["trials"]
        assert [t["trial"] for t in trials] == [t.name for t in spec.trials(method)]
        scores = [t["score"] for t in trials]
        assert chosen["chosen"] == trials[scores.index(max(scores))]["trial"]
        for t in trials:  # each score is the mean over the tuning seeds of the last round's validation accuracy
            records = [json.loads((spec.tuning_dir / "runs" / "s" / method / t["trial"] / f"seed{k}" / TRIAL_FILE)
                                  .read_text()) for k in (10, 11)]
            assert t["score"] == pytest.approx(sum(r["val_acc_macro"][-1] for r in records) / 2)
            assert all(set(r) >= {"rounds", "val_acc_macro", "val_loss"} and "acc_macro" not in r for r in records)
        config_yaml = yaml.safe_load((spec.run_dir("s", method, 0) / "config.yaml").read_text())
        assert config_yaml["training"]["lr"] == chosen["values"]["lr"]
        if method == "fedprox":
            assert config_yaml["hyperparams"]["mu"] == chosen["values"]["mu"]
    # the trials' runs are runs of their own, with their values, on the tuning seeds
    trial = yaml.safe_load((spec.tuning_dir / "runs/s/fedprox/lr0p2-mu0p1/seed11/config.yaml").read_text())
    assert (trial["training"]["lr"], trial["hyperparams"]["mu"], trial["seed"]) == (0.2, 0.1, 11)


def test_aggregate_and_report_show_the_chosen_values_and_the_protocol(tuned):
    root, config = tuned
    assert cli.main(["aggregate", "--config", config]) == 0
    assert cli.main(["report", "--config", config]) == 0
    html = (root / "results/report/index.html").read_text()
    assert 'id="tuning-chosen"' in html and "s-tuning" in html
    assert "Tuned: lr, mu searched per method and scenario (a grid of 2–4 trials) with tuning seeds 10, 11" in html
    md = (root / "results/report/tables/summary.md").read_text()
    assert "lr, mu tuned per method and scenario on validation data (tuning seeds 10, 11)**" in md
    # the scenario table's lr is the spec's; where tuning chose it, it says so
    assert "0.05 (tuned for 2 of 2 methods: their values in the methods table)" in html


def test_a_final_run_without_its_selection_is_refused_in_one_line(tmp_path, capsys):
    config = write_spec(tmp_path / "spec.yaml", spec_dict(tmp_path / "results"))
    assert cli.main(["train", "--config", config, "--scenario", "s", "--method", "fedavg", "--seed", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("tuning/chosen/s/fedavg.json: missing; methods.fedavg is tuned "
                                             "(tuning.space), so its runs on s need their trials and selection "
                                             "first: `cflpipe tune` and `cflpipe tune-select` (snakemake runs both)")
    assert cli.main(["tune-select", "--config", config]) == 3  # no trial trained yet
    assert "trial.json: missing; train the trial first" in capsys.readouterr().err


def test_selection_never_reads_the_test_data(tuned, tmp_path, monkeypatch):
    """Trials trained on test data with shuffled labels and rescaled inputs write the same bytes
    (they read no test split at all) and choose the same values."""
    root, config = tuned
    other_test_data(monkeypatch)
    shuffled = write_spec(tmp_path / "spec.yaml", spec_dict(tmp_path / "results"))
    tune_all(shuffled)
    clean_spec, shuffled_spec = (parse_spec(yaml.safe_load(Path(c).read_text())) for c in (config, shuffled))
    for s, m, t, k in clean_spec.tuning_matrix():
        a, b = (spec.tuning_dir / "runs" / s / m / t / f"seed{k}" for spec in (clean_spec, shuffled_spec))
        ours, theirs = files_of(a), files_of(b)
        del ours["config.yaml"], theirs["config.yaml"]  # their data_dir lines differ
        assert ours == theirs
    for m in ("fedavg", "fedprox"):
        assert clean_spec.chosen_path("s", m).read_bytes() == shuffled_spec.chosen_path("s", m).read_bytes()


def test_a_trials_files_hold_no_test_figure(tuned):
    root, config = tuned
    spec = parse_spec(yaml.safe_load(Path(config).read_text()))
    for s, m, t, k in spec.tuning_matrix():
        run = spec.tuning_dir / "runs" / s / m / t / f"seed{k}"
        rounds = pd.read_parquet(run / "rounds.parquet")
        tested = {"acc_macro", "acc_micro", "acc_worst10", "loss", "f1_macro", "f1_micro", "global_acc_mean",
                  "intra_acc", "inter_acc"}
        assert not tested & set(rounds.columns) and "val_acc_macro" in rounds.columns, sorted(rounds.columns)
        assert set(pd.read_parquet(run / "metrics.parquet")["split"]) <= {"val", "train"}
        summary = json.loads((run / "summary.json").read_text())
        assert not tested & set(summary["final"]) and "best_acc_macro" not in summary
        assert yaml.safe_load((run / "config.yaml").read_text())["training"]["eval_test"] is False
    # the final runs read the test split, and their configs are those of runs before eval_test existed
    final = spec.run_dir("s", "fedavg", 0)
    assert "acc_macro" in pd.read_parquet(final / "rounds.parquet").columns
    assert "eval_test" not in yaml.safe_load((final / "config.yaml").read_text())["training"]


def test_rerunning_changes_nothing_and_a_new_trial_trains_alone(tuned, capsys):
    root, config = tuned
    results = root / "results"
    before = files_of(results / "tuning")
    capsys.readouterr()
    tune_all(config)
    out = capsys.readouterr().out
    assert out.count("already finished") == 12 and "finished: " not in out.replace("already finished", "")
    assert files_of(results / "tuning") == before
    # one more grid value: its trials train, the others are skipped
    data = yaml.safe_load(Path(config).read_text())
    data["tuning"]["space"]["all"]["lr"] = [0.02, 0.2, 0.05]
    bigger = write_spec(root / "bigger.yaml", data)
    assert cli.main(["tune", "--config", bigger, "--scenario", "s", "--method", "fedavg"]) == 0
    out = capsys.readouterr().out
    assert out.count("already finished") == 4 and out.count("lr0p05/seed") == 2
    assert files_of(results / "tuning" / "runs" / "s" / "fedavg" / "lr0p02") == \
        {k[len("runs/s/fedavg/lr0p02/"):]: v for k, v in before.items() if k.startswith("runs/s/fedavg/lr0p02/")}


def test_a_killed_trial_resumes_to_the_bytes_of_an_uninterrupted_one(tuned, tmp_path, monkeypatch):
    root, config = tuned
    data = spec_dict(tmp_path / "results", data_dir=root / "data")  # the same runs as the reference's
    killed = write_spec(tmp_path / "spec.yaml", data)
    with monkeypatch.context() as m:
        die_after_saving(m, 2)
        assert cli.main(["tune", "--config", killed, "--scenario", "s", "--method", "fedprox", "--trial",
                         "lr0p2-mu0p1", "--seed", "11", "--quiet"]) == 1
    run_dir = tmp_path / "results/tuning/runs/s/fedprox/lr0p2-mu0p1/seed11"
    assert (run_dir / "state/state.pt").is_file() and not (run_dir / TRIAL_FILE).exists()
    assert cli.main(["tune", "--config", killed, "--scenario", "s", "--method", "fedprox", "--trial",
                     "lr0p2-mu0p1", "--seed", "11", "--quiet"]) == 0
    assert files_of(run_dir) == files_of(root / "results/tuning/runs/s/fedprox/lr0p2-mu0p1/seed11")


def test_a_diverging_trial_is_recorded_as_failed_and_never_chosen(tmp_path, capsys):
    data = spec_dict(tmp_path / "results")
    data["methods"] = {"fedavg": {}}
    data["training"]["momentum"] = 0.9
    data["tuning"]["space"] = {"all": {"lr": [0.05, 1.0e6]}}
    config = write_spec(tmp_path / "spec.yaml", data)
    tune_all(config, methods=("fedavg",))
    assert "recorded as a diverged trial" in capsys.readouterr().out
    spec = parse_spec(data)
    chosen = json.loads(spec.chosen_path("s", "fedavg").read_text())
    assert chosen["chosen"] == "lr0p05"
    failed = next(t for t in chosen["trials"] if t["trial"] == "lr1000000p0")
    assert failed["score"] is None
    record = json.loads((spec.tuning_dir / "runs/s/fedavg/lr1000000p0/seed10" / TRIAL_FILE).read_text())
    assert record["status"] == "diverged" and "training loss is nan" in record["error"]
    # every trial failing is the selection's error, in one line
    data["tuning"]["space"] = {"all": {"lr": [1.0e6]}}
    config = write_spec(tmp_path / "spec.yaml", data)
    tune_all_failed = cli.main(["tune", "--config", config, "--scenario", "s", "--method", "fedavg", "--quiet"])
    assert tune_all_failed == 0
    capsys.readouterr()
    assert cli.main(["tune-select", "--config", config]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "every trial diverged or has no validation score" in err[0]


def test_the_dvc_pipeline_refuses_a_tuning_spec_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = spec_dict(Path("results"))
    write_spec(tmp_path / "spec.yaml", data)
    assert cli.main(["dvc-runs", "--config", "spec.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the DVC pipeline has no tuning stages" in err[0]


def test_a_spec_without_tuning_resolves_as_before(tmp_path):
    data = spec_dict(tmp_path / "results")
    data.pop("tuning")
    data["protocol"] = "shared"
    spec = parse_spec(copy.deepcopy(data)).with_tuning_choices()
    plain = parse_spec(data)
    assert spec.tuned_methods() == [] and spec.tuning_matrix() == []
    assert runs.resolved_config(spec, "s", "fedprox", 0) == runs.resolved_config(plain, "s", "fedprox", 0)


@pytest.mark.parametrize("protocol, caption, sentence", [
    ("shared", "shared hyper-parameters, untuned", "Shared settings: every method trains with the spec's"),
    ("paper", "the papers' hyper-parameters, untuned", "Paper settings: each method's hyper-parameters are those"),
    (None, "hyper-parameters as the spec sets them, untuned", "Not stated by the spec (its protocol: key)"),
])
def test_the_report_says_how_untuned_hyper_parameters_were_set(protocol, caption, sentence):
    from cflpipe.report.sections import protocol_caption, protocol_sentence

    data = spec_dict(Path("/tmp/unused"))
    data.pop("tuning")
    data["protocol"] = protocol
    spec = parse_spec(data)
    assert protocol_caption(spec) == caption and protocol_sentence(spec).startswith(sentence)
    tuned = parse_spec(spec_dict(Path("/tmp/unused"), sampler="grid"))
    assert protocol_caption(tuned) == "lr, mu tuned per method and scenario on validation data (tuning seeds 10, 11)"
    assert "No choice was made on test data." in protocol_sentence(tuned)


def test_a_key_the_entry_sets_itself_is_not_tuned_and_a_sweep_entry_names_its_entries():
    data = spec_dict(Path("/tmp/unused"))
    data["methods"]["fedprox"] = {"mu": 0.01}
    with pytest.raises(SpecError, match=r"^tuning.space.fedprox.mu: methods.fedprox sets mu itself; tuning would "
                                        r"replace it in every run of the entry"):
        parse_spec(data)
    data = spec_dict(Path("/tmp/unused"))
    data["methods"]["fedprox"] = {"sweep": {"mu": [0.01, 0.1]}}
    data["tuning"]["space"] = {"fedprox": {"lr": [0.02, 0.2]}}
    spec = parse_spec(data)  # the sweep's name stands for the entries it expands into
    assert spec.tuned_methods() == ["fedprox-mu0p01", "fedprox-mu0p1"]
    data["tuning"]["space"] = {"fedprox": {"mu": [0.5]}}
    with pytest.raises(SpecError, match=r"sets mu itself \(its sweep\)"):
        parse_spec(data)


def test_random_draws_that_round_alike_are_refused_when_too_few_remain():
    data = spec_dict(Path("/tmp/unused"), sampler="random", trials=50)
    data["tuning"]["space"] = {"all": {"lr": {"low": 0.1, "high": 0.102}}}
    with pytest.raises(SpecError, match=r"^tuning.trials: 50 draws give only \d+ distinct trials of methods.fedavg"):
        parse_spec(data)
    data["tuning"]["trials"] = 2
    data["tuning"]["space"] = {"all": {"momentum": {"low": 0.9, "high": 0.9999}, "weight_decay": [0.000123456, 0.0]}}
    for t in parse_spec(data).trials("fedavg"):
        assert 0.9 <= t.values["momentum"] <= 0.9999 and t.values["weight_decay"] in (0.000123456, 0.0)


def test_a_selection_made_for_another_tuning_section_is_refused(tuned, tmp_path, capsys):
    root, config = tuned
    data = yaml.safe_load(Path(config).read_text())
    data["tuning"]["space"]["all"]["lr"] = [0.02, 0.2, 0.3]
    other = write_spec(root / "other.yaml", data)
    assert cli.main(["train", "--config", other, "--scenario", "s", "--method", "fedavg", "--seed", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("tuning/chosen/s/fedavg.json: stale: selected over other trials than "
                                             "tuning: now gives; run `cflpipe tune` and `cflpipe tune-select` "
                                             "again (snakemake does)")


def test_eval_test_false_is_for_trials_alone(tmp_path):
    raw = spec_dict(tmp_path / "results")
    raw["methods"]["fedavg"] = {"training": {"eval_test": False}}
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    assert str(err.value) == ("methods.fedavg.training.eval_test: false is set by tuning for its trials (they read "
                              "no test data); a spec's own runs are reported on their test splits, so leave it out")


def test_a_tuning_mistake_is_said_beside_a_methods_own(tmp_path):
    raw = spec_dict(tmp_path / "results")
    raw["methods"]["fedavg"] = {"mu": 1}
    raw["tuning"]["space"]["fedprox"] = {"nope": [1, 2]}
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    lines = str(err.value).splitlines()
    assert any(line.startswith("methods.fedavg.mu: unknown key") for line in lines)
    assert any(line.startswith("tuning.space.fedprox.nope: methods.fedprox (fedprox) has no hyper-parameter nope")
               for line in lines), lines


def test_trials_on_a_drift_scenario_read_no_test_data_either(tmp_path):
    raw = spec_dict(tmp_path / "results")
    raw["scenarios"]["s"]["drift"] = [{"round": 3, "fraction": 0.25}]
    raw["methods"] = {"ifca": {"clusters": 2}}
    raw["tuning"]["space"] = {"all": {"lr": [0.02, 0.2]}}
    config = write_spec(tmp_path / "spec.yaml", raw)
    tune_all(config, methods=("ifca",))
    spec = parse_spec(raw)
    for s, m, t, k in spec.tuning_matrix():
        run = spec.tuning_dir / "runs" / s / m / t / f"seed{k}"
        summary = json.loads((run / "summary.json").read_text())
        assert "drift" not in summary and not (run / "drift.parquet").exists()
        assert set(pd.read_parquet(run / "metrics.parquet")["split"]) <= {"val", "train"}
