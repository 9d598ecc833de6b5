"""A validation split per client (scenario validation_fraction, #44 item 1): carved from the
training data, recorded in the partition, evaluated every evaluation round, and what the best
round is chosen on; without it, a test-selected best round is named for what it is."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cflpipe.errors import SpecError
from cflpipe.fl.engine import train_run
from cflpipe.fl.outputs import best_round
from cflpipe.partition import build_partition, client_indices
from cflpipe.spec import Scenario, parse_spec

from conftest import other_test_data
from test_partition import digits


def scenario(**kwargs) -> Scenario:
    return Scenario(dataset={"name": "digits"}, clients=12, partition=[{"kind": "dirichlet", "alpha": 0.5}], **kwargs)


def test_the_validation_split_is_carved_from_each_clients_training_data():
    without = build_partition(scenario(), digits())
    with_val = build_partition(scenario(validation_fraction=0.25), digits())
    before, after = client_indices(without), client_indices(with_val)
    stats = with_val.stats
    for c in range(12):
        assert np.array_equal(after[c]["test"], before[c]["test"])  # the test split is the one without validation
        assert np.array_equal(np.sort(np.concatenate([after[c]["train"], after[c]["val"]])), before[c]["train"])
        n_train = len(before[c]["train"])
        expected = min(max(int(np.rint(0.25 * n_train)), 1), n_train - 1) if n_train >= 2 else 0
        assert len(after[c]["val"]) == expected == stats.loc[c, "n_val"]
        assert stats.loc[c, "n_train"] == n_train - expected and stats.loc[c, "n_test"] == len(before[c]["test"])
    assert set(with_val.clients["split"]) == {"train", "test", "val"}
    # seeded by the scenario: the same draw again, another with another partition seed
    again = client_indices(build_partition(scenario(validation_fraction=0.25), digits()))
    other = client_indices(build_partition(scenario(validation_fraction=0.25, seed=1), digits()))
    assert all(np.array_equal(again[c]["val"], after[c]["val"]) for c in range(12))
    assert any(not np.array_equal(other[c]["val"], after[c]["val"]) for c in range(12))


def test_a_scenario_without_validation_keeps_its_partition_and_definition():
    sc = scenario()
    assert "validation_fraction" not in sc.definition()  # runs and partitions before it keep their fingerprints
    assert "validation_fraction" in scenario(validation_fraction=0.1).definition()
    assert "n_val" not in build_partition(sc, digits()).stats.columns
    with pytest.raises(ValueError, match="validation_fraction"):
        scenario(validation_fraction=1.0)


def spec_dict(tmp_path, validation_fraction: float = 0.2, method: str = "ifca") -> dict:
    sc = {"dataset": "digits", "clients": 8, "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}
    if validation_fraction:
        sc["validation_fraction"] = validation_fraction
    return {"seeds": [0],
            "training": {"model": "mlp", "rounds": 6, "clients_per_round": 4, "local_steps": 3, "batch_size": 16,
                         "lr": 0.05, "eval_every": 1, "device": "cpu", "eval_train": True},
            "scenarios": {"s": sc}, "methods": {method: {"clusters": 2} if method == "ifca" else {}},
            "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data")}


def test_a_run_with_a_validation_split_evaluates_it_and_selects_on_it(tmp_path):
    result = train_run(parse_spec(spec_dict(tmp_path)), "s", "ifca", 0, progress=False)
    metrics = pd.read_parquet(result.run_dir / "metrics.parquet")
    rounds = pd.read_parquet(result.run_dir / "rounds.parquet")
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert set(metrics["split"]) == {"train", "test", "val"}
    val = metrics[(metrics["split"] == "val") & (metrics["round"] == 6)]
    assert len(val) == 8 and (val["n"] > 0).all()
    evaluated = rounds[rounds["eval"]] if "eval" in rounds else rounds.dropna(subset=["val_acc_macro"])
    assert np.isclose(evaluated["val_acc_macro"].iloc[-1], val["acc"].mean())
    best = evaluated.loc[evaluated["val_acc_macro"].idxmax()]
    assert summary["best_selected_on"] == "validation" and summary["best_round"] == int(best["round"])
    assert summary["best_acc_macro"] == pytest.approx(best["acc_macro"])
    assert "best_test_acc_macro" not in summary


@pytest.mark.parametrize("method", ["ifca", "oracle_mcfl"])  # a model per cluster; a model chosen by the inputs
def test_selection_never_reads_the_test_data(tmp_path, monkeypatch, method):
    """The test split's labels shuffled and its inputs scaled before training change the test
    figures and nothing that validation reads: the selected round, and every validation row."""
    spec = parse_spec(spec_dict(tmp_path / "clean", method=method))
    clean_dir = train_run(spec, "s", method, 0, progress=False).run_dir
    other_test_data(monkeypatch)
    spec = parse_spec(spec_dict(tmp_path / "shuffled", method=method))
    shuffled_dir = train_run(spec, "s", method, 0, progress=False).run_dir
    clean, shuffled = (json.loads((d / "summary.json").read_text()) for d in (clean_dir, shuffled_dir))
    assert shuffled["final"]["acc_macro"] != clean["final"]["acc_macro"]  # the test data did change
    for key in ("best_round", "best_val_acc_macro", "best_selected_on"):
        assert shuffled[key] == clean[key], key
    val_rows = [pd.read_parquet(d / "metrics.parquet").query("split == 'val'").reset_index(drop=True)
                for d in (clean_dir, shuffled_dir)]
    pd.testing.assert_frame_equal(*val_rows)


def test_without_a_validation_split_the_best_round_is_named_as_chosen_on_test(tmp_path):
    result = train_run(parse_spec(spec_dict(tmp_path, validation_fraction=0)), "s", "ifca", 0, progress=False)
    summary = json.loads((result.run_dir / "summary.json").read_text())
    rounds = pd.read_parquet(result.run_dir / "rounds.parquet")
    assert summary["best_selected_on"] == "test" and "best_acc_macro" not in summary
    assert summary["best_test_acc_macro"] == pytest.approx(rounds["acc_macro"].max())
    assert "val_acc_macro" not in rounds.columns
    assert set(pd.read_parquet(result.run_dir / "metrics.parquet")["split"]) == {"train", "test"}


def test_the_best_round_is_the_first_of_equal_validation_scores():
    full = pd.DataFrame({"round": [1, 2, 3, 4], "acc_macro": [0.5, 0.9, 0.6, 0.7],
                         "val_acc_macro": [0.4, 0.6, 0.8, 0.8]})
    assert best_round(full) == {"best_acc_macro": 0.6, "best_val_acc_macro": 0.8, "best_round": 3,
                                "best_selected_on": "validation"}
    assert best_round(full.drop(columns="val_acc_macro"))["best_round"] == 2
    assert best_round(full[:0])["best_round"] is None


def test_a_negative_validation_fraction_is_refused_in_one_line(tmp_path):
    raw = spec_dict(tmp_path)
    raw["scenarios"]["s"]["validation_fraction"] = -0.1
    with pytest.raises(SpecError, match=r"scenarios\.s\.validation_fraction"):
        parse_spec(raw)


def test_a_sampled_evaluation_reads_the_samples_validation_rows_and_selects_among_full_ones(tmp_path):
    raw = spec_dict(tmp_path)
    raw["training"].update(eval_clients=3, full_eval_every=3)
    result = train_run(parse_spec(raw), "s", "ifca", 0, progress=False)
    metrics = pd.read_parquet(result.run_dir / "metrics.parquet")
    val = metrics[metrics["split"] == "val"].groupby("round").size()
    assert val.to_dict() == {1: 3, 2: 3, 3: 8, 4: 3, 5: 3, 6: 8}
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["best_round"] in (3, 6)  # a sampled round's figure is an estimate from fewer clients


def test_small_validation_sets_are_warned_about_in_one_line():
    from cflpipe.partition import small_validation_sets

    stats = build_partition(scenario(validation_fraction=0.05), digits()).stats
    line = small_validation_sets(stats)
    assert line is not None and line.startswith(f"{int((stats['n_val'] < 10).sum())} of 12 clients have fewer than 10 "
                                                f"validation samples (fewest: {int(stats['n_val'].min())})")
    assert small_validation_sets(build_partition(scenario(validation_fraction=0.5), digits()).stats) is None
    assert small_validation_sets(build_partition(scenario(), digits()).stats) is None  # no validation split
