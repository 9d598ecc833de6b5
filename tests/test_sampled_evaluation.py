"""Evaluation of a seeded client sample between full evaluations (training.eval_clients): what a
sampled round reads and records, that it is the full evaluation's figures for those clients, and
that specs without it keep their runs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from cflpipe.errors import SpecError
from cflpipe.fl.engine import train_run
from cflpipe.spec import parse_spec

CLIENTS = 12


def spec_dict(tmp_path, method: str = "ifca", **training) -> dict:
    return {
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 4, "clients_per_round": 6, "local_steps": 3, "batch_size": 16,
                     "lr": 0.05, "eval_every": 1, "device": "cpu", **training},
        "scenarios": {"s": {"dataset": "digits", "clients": CLIENTS,
                            "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
        "methods": {method: {"clusters": 2} if method in ("ifca", "fedem") else {}},
        "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data"),
    }


def run(tmp_path, method: str = "ifca", **training):
    spec = parse_spec(spec_dict(tmp_path, method, **training))
    result = train_run(spec, "s", method, 0, progress=False)
    read = lambda name: pd.read_parquet(result.run_dir / f"{name}.parquet")  # noqa: E731
    return result, read("rounds"), read("metrics"), read("clusters")


# One method of each predictor shape: Models (ifca, ditto, perfedavg), Mixture (fedem), Selected
# (oracle_mcfl; IFCA's MCFL would select by cluster means that the clients left out of a sample
# did not choose again, so its sampled figures are not the full ones).
@pytest.mark.parametrize("method", ["ifca", "ditto", "perfedavg", "fedem", "oracle_mcfl"])
def test_sampled_rounds_read_the_sample_and_full_rounds_every_client(tmp_path, method):
    result, rounds, metrics, clusters = run(tmp_path / "sampled", method, eval_clients=5, full_eval_every=2,
                                            eval_train=True)
    assert rounds["evaluated_clients"].tolist() == [5, CLIENTS, 5, CLIENTS]
    for r, expected in zip(range(1, 5), [5, CLIENTS, 5, CLIENTS]):
        for split in ("test", "train"):
            assert len(metrics[(metrics["round"] == r) & (metrics["split"] == split)]) == expected
        assert len(clusters[clusters["round"] == r]) == CLIENTS  # the clustering is always everyone's
    first, third = (set(metrics.loc[metrics["round"] == r, "client"]) for r in (1, 3))
    assert first != third  # seeded by round

    # Training does not see evaluation: the full run's figures for the sampled clients are the
    # sampled round's (two evaluation paths: rows applied in other chunks, so to rounding).
    _, full_rounds, full_metrics, full_clusters = run(tmp_path / "full", method, eval_train=True)
    assert "evaluated_clients" not in full_rounds.columns
    full_rounds_only = lambda t: t[t["round"] % 2 == 0].reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(full_rounds_only(clusters), full_rounds_only(full_clusters))
    for r in (1, 3):
        # IFCA's sampled clients choose their cluster again, as in a full evaluation.
        chosen = metrics.loc[metrics["round"] == r, "client"].unique()
        sampled_rows = lambda t: t[(t["round"] == r) & t["client"].isin(chosen)].reset_index(drop=True)  # noqa: E731
        pd.testing.assert_frame_equal(sampled_rows(clusters), sampled_rows(full_clusters))
    for r in (1, 3):
        sampled = metrics[metrics["round"] == r].sort_values(["split", "client"]).reset_index(drop=True)
        whole = full_metrics[(full_metrics["round"] == r) & full_metrics["client"].isin(sampled["client"])]
        whole = whole.sort_values(["split", "client"]).reset_index(drop=True)
        assert (sampled[["client", "split", "model", "group", "n"]] == whole[["client", "split", "model", "group",
                                                                               "n"]]).all().all()
        np.testing.assert_allclose(sampled["loss"], whole["loss"], rtol=1e-5)
        assert np.abs(sampled["acc"] - whole["acc"]).max() * sampled["n"].max() <= 1.0  # a tie at most
    for r in (2, 4):
        pd.testing.assert_frame_equal(metrics[metrics["round"] == r].reset_index(drop=True),
                                      full_metrics[full_metrics["round"] == r].reset_index(drop=True),
                                      check_exact=False, rtol=1e-5)


def test_the_best_accuracy_is_the_best_full_evaluation_and_reruns_are_identical(tmp_path):
    result, rounds, metrics, _ = run(tmp_path / "a", eval_clients=3)
    full = rounds[rounds["evaluated_clients"] == CLIENTS]
    assert full["round"].tolist() == [4]
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["best_test_acc_macro"] == pytest.approx(full["acc_macro"].max()) and summary["best_round"] == 4
    again, *_ = run(tmp_path / "b", eval_clients=3)
    for name in ("rounds.parquet", "metrics.parquet", "clusters.parquet"):
        assert (result.run_dir / name).read_bytes() == (again.run_dir / name).read_bytes()


def test_a_sample_as_large_as_the_clients_is_a_full_evaluation(tmp_path):
    _, rounds, metrics, _ = run(tmp_path, eval_clients=CLIENTS + 5)
    assert rounds["evaluated_clients"].tolist() == [CLIENTS] * 4


def test_full_evaluations_off_the_eval_every_grid_are_still_held(tmp_path):
    _, rounds, _, _ = run(tmp_path, eval_every=4, eval_clients=4, full_eval_every=3)
    assert rounds.dropna(subset=["acc_macro"])["round"].tolist() == [3, 4]


def test_runs_without_a_sample_keep_their_config(tmp_path):
    result, *_ = run(tmp_path, eval_train=True)  # what every run before eval_train: auto did
    config = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    later = {"eval_clients", "full_eval_every", "eval_train", "precision", "compile",
             "full_eval_clients"}  # added after runs existed
    assert not later & set(config["training"])
    # auto reads other training splits than those runs did: it is recorded, so they are redone
    result, *_ = run(tmp_path / "auto")
    assert yaml.safe_load((result.run_dir / "config.yaml").read_text())["training"]["eval_train"] == "auto"


def test_full_eval_every_without_a_sample_is_one_line(tmp_path):
    with pytest.raises(SpecError) as info:
        parse_spec(spec_dict(tmp_path, full_eval_every=2))
    assert str(info.value) == ("training.full_eval_every: needs eval_clients (without a sample every evaluation is "
                               "full), got 2")
    # the sample may come from another layer: the rule holds for each run's merged training
    raw = spec_dict(tmp_path, full_eval_every=2)
    raw["methods"]["ifca"]["training"] = {"eval_clients": 4}
    assert parse_spec(raw).resolved_training("s", "ifca").eval_clients == 4


def test_without_the_train_split_only_test_rows_are_written(tmp_path):
    _, rounds, metrics, _ = run(tmp_path, eval_train=False)
    assert set(metrics["split"]) == {"test"} and len(metrics) == 4 * CLIENTS
    assert "train_acc_macro" not in rounds.columns and rounds["acc_macro"].notna().all()


def test_a_sample_missing_a_group_scores_intra_and_inter_accuracy_on_the_groups_it_holds(tmp_path):
    raw = spec_dict(tmp_path, "oracle", eval_clients=3)
    raw["scenarios"]["s"]["partition"][1]["groups"] = 4  # 3 sampled clients of 12 miss a group
    result = train_run(parse_spec(raw), "s", "oracle", 0, progress=False)
    rounds = pd.read_parquet(result.run_dir / "rounds.parquet")
    sampled = rounds[rounds["evaluated_clients"] == 3]
    assert len(sampled) == 3 and np.isfinite(sampled[["intra_acc", "inter_acc"]].to_numpy()).all()


def test_a_subclass_that_replaces_the_cluster_models_is_evaluated_with_them_when_sampled(tmp_path):
    """One hook gives the models of full and sampled evaluations alike (cluster_models(clients)),
    so a subclass that replaces it cannot be bypassed by a sampled form it did not write."""
    from cflpipe.fl.engine import prepare_run
    from cflpipe.methods.ifca import IFCA

    asked = []

    class Own(IFCA):
        def cluster_models(self, clients=None):
            asked.append(None if clients is None else list(clients))
            return super().cluster_models(clients)

    spec = parse_spec(spec_dict(tmp_path, eval_clients=5))
    ctx = prepare_run(spec, "s", "ifca", 0).ctx
    sample = np.array([1, 4, 7])
    predictor = Own(ctx).predictor(sample)
    assert asked == [[1, 4, 7]] and len(predictor.models) == 2 and len(predictor.index) == CLIENTS


@pytest.mark.parametrize("hook", ["eval_params", "eval_models", "eval_models_of", "eval_mixture", "row_mixture",
                                  "select_model", "selects_by_data", "cluster_eval_models", "cluster_eval_models_of"])
@pytest.mark.parametrize("in_mixin", [False, True])
def test_the_evaluation_hooks_of_before_the_one_evaluation_shape_are_refused(hook, in_mixin):
    """On the class or on a mixin it lists (as PersonalModels is listed): either way the hook
    would be silently ignored."""
    from cflpipe.methods.ifca import IFCA

    own = {hook: lambda self, *args: None}
    bases = (type("Mixin", (), own), IFCA) if in_mixin else (IFCA,)
    with pytest.raises(TypeError, match=f"defines {hook}, an evaluation hook cflpipe no longer calls"):
        type("Old", bases, {} if in_mixin else own)


def test_eval_train_auto_reads_every_training_split_only_where_that_costs_no_more_than_a_round(tmp_path):
    """auto: an evaluation reads at most EVAL_ROWS_PER_TRAINED_ROW rows per row a round trains.
    12 clients of ~120 training and 30 test rows, 6 a round, batch 16: at 10 local steps (1,920
    rows to read) every client's training split fits, at 6 steps (1,152) the test split leaves
    room for 6 clients', at 1 step (192) for none."""
    from cflpipe.fl.data import build_federated_data
    from cflpipe.fl.evaluation import EVAL_ROWS_PER_TRAINED_ROW, train_split_clients

    def chosen(steps: int, seed: int = 0, **training):
        spec = parse_spec(spec_dict(tmp_path, local_steps=steps, **training))
        data = build_federated_data(spec, "s", torch.device("cpu"))
        return data, spec.resolved_training("s", "ifca"), train_split_clients(
            data, spec.resolved_training("s", "ifca"), seed)

    data, training, every = chosen(10)
    assert every is None
    data, training, some = chosen(6)
    budget = EVAL_ROWS_PER_TRAINED_ROW * 6 * 6 * 16 - data.test.sizes().sum()
    sizes = data.train.sizes()
    assert 0 < len(some) < CLIENTS and sizes[some].sum() <= budget
    assert list(some) == sorted(some) and np.array_equal(some, chosen(6)[2])  # seeded: the same each time
    assert not np.array_equal(some, chosen(6, seed=1)[2])  # by the run's seed
    assert len(chosen(1)[2]) == 0
    assert chosen(1, eval_train=True)[2] is None and len(chosen(10, eval_train=False)[2]) == 0


def test_eval_train_auto_reads_its_sample_s_training_splits_in_every_evaluation(tmp_path):
    """The sampled clients' training rows are those of a run that reads every client's, the
    others have none; every evaluation (sampled evaluations too) reads the same clients'; the
    rounds say how many."""
    from cflpipe.fl.data import build_federated_data
    from cflpipe.fl.evaluation import train_split_clients

    result, rounds, metrics, _ = run(tmp_path / "auto", "ifca", local_steps=6, eval_clients=5, full_eval_every=2)
    spec = parse_spec(spec_dict(tmp_path / "auto", local_steps=6))
    sample = train_split_clients(build_federated_data(spec, "s", torch.device("cpu")),
                                 spec.resolved_training("s", "ifca"), 0)
    train = metrics[metrics["split"] == "train"]
    for r in (2, 4):  # full evaluations: the sample's clients
        assert train.loc[train["round"] == r, "client"].tolist() == sample.tolist()
    for r in (1, 3):  # sampled evaluations: the sample's clients among the evaluated
        evaluated = set(metrics.loc[(metrics["round"] == r) & (metrics["split"] == "test"), "client"])
        assert set(train.loc[train["round"] == r, "client"]) == evaluated & set(sample.tolist())
    assert rounds["train_evaluated_clients"].tolist() == [len(set(metrics.loc[(metrics["round"] == r) & (
        metrics["split"] == "train"), "client"])) for r in range(1, 5)]
    _, full_rounds, full_metrics, _ = run(tmp_path / "every", "ifca", local_steps=6, eval_train=True)
    mine = train[train["round"] == 4].reset_index(drop=True)
    theirs = full_metrics[(full_metrics["round"] == 4) & (full_metrics["split"] == "train")
                          & full_metrics["client"].isin(sample)].reset_index(drop=True)
    pd.testing.assert_frame_equal(mine, theirs, check_exact=False, rtol=1e-5)
    assert np.isclose(rounds["train_acc_macro"].iloc[-1], mine["acc"].mean())
    test_rows = lambda m: m[m["split"] == "test"].reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(test_rows(metrics[metrics["round"] == 4]), test_rows(full_metrics[
        full_metrics["round"] == 4]), check_exact=False, rtol=1e-5)


# --------------------------------------------------------------------------- full_eval_clients


def evaluated(metrics: pd.DataFrame, r: int) -> list[int]:
    return metrics.loc[(metrics["round"] == r) & (metrics["split"] == "test"), "client"].tolist()


# Models by cluster (ifca), a model per client built for the sample alone (fedper), a mixture (fedem).
@pytest.mark.parametrize("method", ["ifca", "fedper", "fedem"])
def test_a_full_evaluation_of_a_population_sample_reads_the_same_clients_for_every_method_and_round(
        tmp_path, method):
    result, rounds, metrics, clusters = run(tmp_path / "sample", method, full_eval_clients=5, eval_train=True)
    population = evaluated(metrics, 1)
    assert len(population) == 5 and rounds["evaluated_clients"].tolist() == [5] * 4
    from sklearn.metrics import adjusted_rand_score

    for r in range(1, 5):
        assert evaluated(metrics, r) == population
        assert metrics.loc[(metrics["round"] == r) & (metrics["split"] == "train"), "client"].tolist() == population
        held = clusters[clusters["round"] == r]
        assert len(held) == CLIENTS  # clusters.parquet holds everyone's, the ARI is the population's
        mine = held[held["client"].isin(population)]
        assert rounds.loc[rounds["round"] == r, "ari"].item() == pytest.approx(
            adjusted_rand_score(mine["true_group"], mine["cluster"]))
    _, _, fedavg_metrics, _ = run(tmp_path / "fedavg", "fedavg", full_eval_clients=5)
    assert evaluated(fedavg_metrics, 4) == population  # by the run's seed alone
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["best_round"] == int(rounds.loc[rounds["acc_macro"].idxmax(), "round"])

    # Training does not see evaluation: the clients' figures are a full run's (two evaluation
    # paths: rows applied in other groups, so to rounding).
    _, full_rounds, full_metrics, full_clusters = run(tmp_path / "full", method, eval_train=True)
    # IFCA's evaluated clients choose their cluster again by loss, the others keep their last choice
    same = (lambda t: t[t["client"].isin(population)].reset_index(drop=True)) if method == "ifca" else (  # noqa: E731
        lambda t: t)
    pd.testing.assert_frame_equal(same(clusters), same(full_clusters))
    mine = metrics.sort_values(["round", "split", "client"]).reset_index(drop=True)
    theirs = full_metrics[full_metrics["client"].isin(population)].sort_values(["round", "split", "client"])
    theirs = theirs.reset_index(drop=True)
    assert (mine[["round", "client", "split", "model", "group", "n"]]
            == theirs[["round", "client", "split", "model", "group", "n"]]).all().all()
    np.testing.assert_allclose(mine["loss"], theirs["loss"], rtol=1e-5)
    assert np.abs(mine["acc"] - theirs["acc"]).max() * mine["n"].max() <= 1.0  # a tie at most
    np.testing.assert_allclose(rounds["train_loss"], full_rounds["train_loss"], rtol=0, atol=0)


def population_of(tmp_path, seed: int = 0, raw: dict | None = None, **training):
    from cflpipe.fl.data import build_federated_data
    from cflpipe.fl.evaluation import evaluated_population

    spec = parse_spec(raw or spec_dict(tmp_path, **training))
    return evaluated_population(build_federated_data(spec, "s", torch.device("cpu")),
                                spec.resolved_training("s", "ifca"), seed)


def test_the_population_sample_is_seeded_by_the_run_and_a_larger_one_holds_a_smaller_one(tmp_path):
    five = population_of(tmp_path, full_eval_clients=5)
    assert list(five) == sorted(five) and len(five) == 5
    assert np.array_equal(five, population_of(tmp_path, full_eval_clients=5))
    assert not np.array_equal(five, population_of(tmp_path, seed=1, full_eval_clients=5))
    assert set(five) < set(population_of(tmp_path, full_eval_clients=8))
    assert population_of(tmp_path, full_eval_clients=CLIENTS) is None
    assert population_of(tmp_path, full_eval_clients="all") is None
    assert population_of(tmp_path) is None  # auto: 12 clients are far fewer than AUTO_EVAL_CLIENTS


def test_auto_samples_a_population_larger_than_its_size_unless_clients_move(tmp_path, monkeypatch):
    from cflpipe.spec import _models

    monkeypatch.setattr(_models, "AUTO_EVAL_CLIENTS", 5)
    assert len(population_of(tmp_path)) == 5
    raw = spec_dict(tmp_path)
    raw["scenarios"]["s"]["drift"] = [{"round": 2, "fraction": 0.25}]
    assert population_of(tmp_path, raw=raw) is None  # drift figures follow every mover
    raw["training"]["full_eval_clients"] = 5
    assert population_of(tmp_path, raw=raw) is None  # whatever the value
    _, rounds, metrics, _ = run(tmp_path / "auto", "ifca")
    assert rounds["evaluated_clients"].tolist() == [5] * 4 and len(evaluated(metrics, 4)) == 5


def test_sampled_rounds_between_full_ones_of_a_population_sample(tmp_path):
    result, rounds, metrics, _ = run(tmp_path, eval_clients=3, full_eval_clients=6, full_eval_every=2)
    assert rounds["evaluated_clients"].tolist() == [3, 6, 3, 6]
    assert evaluated(metrics, 2) == evaluated(metrics, 4)
    assert set(evaluated(metrics, 1)) | set(evaluated(metrics, 3)) <= set(evaluated(metrics, 4))  # drawn from it
    summary = json.loads((result.run_dir / "summary.json").read_text())
    full = rounds[rounds["evaluated_clients"] == 6]
    assert summary["best_test_acc_macro"] == pytest.approx(full["acc_macro"].max())
    assert summary["best_round"] in (2, 4)


@pytest.mark.parametrize("value", [0, -3, 2.5, "some", True, None])
def test_a_bad_full_eval_clients_is_one_line(tmp_path, value):
    with pytest.raises(SpecError) as info:
        parse_spec(spec_dict(tmp_path, full_eval_clients=value))
    shown = {0: "0", -3: "-3", 2.5: "2.5", "some": "'some'", True: "true", None: "null"}[value]
    assert str(info.value) == (f"training.full_eval_clients: must be a number of clients (>= 1), 'auto' or 'all', "
                               f"got {shown}")


def test_a_sampled_evaluation_s_models_read_at_most_so_many_pooled_rows_per_row(tmp_path, monkeypatch):
    """Models a sampled evaluation scores on its clients' pooled test data (here every sampled
    client's own model) read a seeded sample of it past SCORED_ROWS_PER_TEST_ROW rows per row;
    a full evaluation of every client reads all of it (MAX_SCORED_ROWS alone)."""
    from cflpipe.fl import evaluation

    monkeypatch.setattr(evaluation, "SCORED_ROWS_PER_TEST_ROW", 2)
    _, rounds, metrics, _ = run(tmp_path / "sample", "ditto", full_eval_clients=5)
    pooled = int(metrics.loc[(metrics["round"] == 4) & (metrics["split"] == "test"), "n"].sum())
    assert rounds["global_models"].tolist() == [5] * 4
    assert rounds["global_rows"].tolist() == [2 * pooled // 5] * 4
    _, every, _, _ = run(tmp_path / "every", "ditto")
    assert "global_rows" not in every.columns and every["global_models"].tolist() == [CLIENTS] * 4
    # a sampled round of a run that reads every client in full evaluations reads what it read before
    _, sampled, _, _ = run(tmp_path / "eval_clients", "ditto", eval_clients=5)
    assert "global_rows" not in sampled.columns and sampled["global_models"].tolist() == [5, 5, 5, CLIENTS]


def test_a_scenario_that_moves_clients_reads_every_client_whatever_the_value(tmp_path):
    """Drift figures follow every mover at every full evaluation (drift.parquet, the summary's
    final figures): a sample would leave them at the move rounds alone."""
    raw = spec_dict(tmp_path / "five", eval_every=4, full_eval_clients=5, eval_clients=3)
    raw["scenarios"]["s"]["drift"] = [{"round": 2, "fraction": 0.25}]
    result = train_run(parse_spec(raw), "s", "ifca", 0, progress=False)
    rounds = pd.read_parquet(result.run_dir / "rounds.parquet").dropna(subset=["acc_macro"])
    assert dict(zip(rounds["round"], rounds["evaluated_clients"])) == {1: CLIENTS, 2: CLIENTS, 4: CLIENTS}
    assert sorted(pd.read_parquet(result.run_dir / "drift.parquet")["round"].unique()) == [1, 2, 4]
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["best_test_acc_macro"] == pytest.approx(rounds["acc_macro"].max())


def test_auto_is_recorded_in_the_runs_it_samples_and_left_out_of_the_others(tmp_path):
    """A population past AUTO_EVAL_CLIENTS evaluated every client before full_eval_clients
    existed: its runs record auto (made again once), the others keep their definition."""
    from cflpipe.spec._models import AUTO_EVAL_CLIENTS
    from cflpipe.fl.runs import resolved_config

    raw = spec_dict(tmp_path)
    raw["scenarios"]["big"] = {"dataset": {"name": "synthetic", "devices": AUTO_EVAL_CLIENTS + 1},
                               "clients": AUTO_EVAL_CLIENTS + 1, "partition": [{"kind": "natural"}]}
    spec = parse_spec(raw)
    assert "full_eval_clients" not in resolved_config(spec, "s", "ifca", 0)["training"]
    assert resolved_config(spec, "big", "ifca", 0)["training"]["full_eval_clients"] == "auto"
    raw["training"]["full_eval_clients"] = "all"  # every client, as runs before it: nothing to redo
    assert "full_eval_clients" not in resolved_config(parse_spec(raw), "big", "ifca", 0)["training"]
    raw["training"]["full_eval_clients"] = 5  # a sample: recorded wherever it samples
    assert resolved_config(parse_spec(raw), "s", "ifca", 0)["training"]["full_eval_clients"] == 5
    raw["training"]["full_eval_clients"] = CLIENTS
    assert "full_eval_clients" not in resolved_config(parse_spec(raw), "s", "ifca", 0)["training"]


def test_a_pair_table_holds_the_pairs_of_the_clients_full_evaluations_read(tmp_path):
    """PACFL's proximity matrix as a long table: the population's pairs (every pair when it is
    every client), the same values as the full matrix's."""
    raw = spec_dict(tmp_path / "sample", "pacfl", full_eval_clients=5)
    raw["methods"] = {"pacfl": {"clusters": 2}}
    result = train_run(parse_spec(raw), "s", "pacfl", 0, progress=False)
    pairs = pd.read_parquet(result.run_dir / "proximity.parquet")
    population = sorted(pd.read_parquet(result.run_dir / "metrics.parquet")["client"].unique())
    assert len(population) == 5 and len(pairs) == 4 * 25
    assert sorted(pairs["client"].unique()) == population and sorted(pairs["other"].unique()) == population
    raw = spec_dict(tmp_path / "every", "pacfl")
    raw["methods"] = {"pacfl": {"clusters": 2}}
    every = pd.read_parquet(train_run(parse_spec(raw), "s", "pacfl", 0, progress=False).run_dir / "proximity.parquet")
    assert len(every) == 4 * CLIENTS ** 2
    mine = every[every["client"].isin(population) & every["other"].isin(population)].reset_index(drop=True)
    pd.testing.assert_frame_equal(pairs, mine)


def test_validate_says_where_full_evaluations_read_a_sample(tmp_path, capsys):
    from cflpipe.cli import main
    from cflpipe.spec._models import AUTO_EVAL_CLIENTS

    raw = spec_dict(tmp_path)
    raw["scenarios"]["big"] = {"dataset": {"name": "synthetic", "devices": AUTO_EVAL_CLIENTS + 1, "max_samples": 10},
                               "clients": AUTO_EVAL_CLIENTS + 1, "partition": [{"kind": "natural"}]}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["validate", "--config", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [f"scenario big: full evaluations read a seeded sample of 1,000 of its "
                         f"{AUTO_EVAL_CLIENTS + 1:,} clients, the same for every method "
                         f"(training.full_eval_clients; all: every client)"]


@pytest.mark.parametrize("method", ["ifca", "fedtsdp", "fcca"])
def test_a_run_that_samples_its_population_resumes_to_the_same_bytes(tmp_path, method):
    """Killed after a checkpoint, a run whose full evaluations read a sample (IFCA's choice by
    loss, FedTSDP's models built for the sample, FCCA's table of the sample's pairs) resumes to
    the uninterrupted run's outputs."""
    from cflpipe.testing import _killed_then_resumed, finished, same_bytes, spec_dict as checks_spec

    whole = finished(tmp_path / "whole", method, full_eval_clients=4, eval_every=1)
    resumed = _killed_then_resumed(parse_spec(checks_spec(tmp_path / "resumed", method, full_eval_clients=4,
                                                          eval_every=1)), method, 2)
    assert pd.read_parquet(whole / "rounds.parquet")["evaluated_clients"].tolist() == [4] * 4
    same_bytes(whole, resumed)
