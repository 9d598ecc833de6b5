"""Groups that change (scenario drift): the partition's seeded moves, the data a moved client
holds before and after, what a run reports of them, validate's lines for bad values. The
conformance suite's check_changing_clients_resume runs every method across a move."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from cflpipe.data import load_dataset
from cflpipe.errors import SpecError
from cflpipe.fl.engine import prepare_run, train_run
from cflpipe.partition import apply_transform, build_partition
from cflpipe.partition_files import DIGESTS, partition_scenario
from cflpipe.spec import parse_spec
from conftest import validate_refuses

torch.set_num_threads(1)


def raw_spec(tmp_path, partition=None, drift=None, **training) -> dict:
    return {
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 10, "clients_per_round": 12, "local_steps": 10, "batch_size": 32,
                     "lr": 0.05, "eval_every": 5, "trainer": "sequential", **training},
        "scenarios": {"rot": {"dataset": "digits", "clients": 12, "hyperparams": {"clusters": 3},
                              "partition": partition or [{"kind": "iid"}, {"kind": "rotation", "groups": 3}],
                              "drift": drift or [{"round": 6, "fraction": 0.25}]}},
        "methods": {"fedavg": {}, "ifca": {}, "oracle": {}},
        "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data")}


def test_the_moves_are_seeded_recorded_and_keep_what_is_not_the_truth(tmp_path):
    partition = [{"kind": "iid"}, {"kind": "rotation", "groups": 2, "ground_truth": False},
                 {"kind": "label_swap", "groups": 3}]
    drift = [{"round": 3, "fraction": 0.25}, {"round": 7, "fraction": 0.5}]
    spec = parse_spec(raw_spec(tmp_path, partition, drift))
    sc = spec.scenarios["rot"]
    dataset = load_dataset("digits", {}, spec.data_dir)
    first, again = (build_partition(sc, dataset) for _ in range(2))
    pd.testing.assert_frame_equal(first.moves, again.moves)
    moves = first.moves
    assert moves["round"].tolist() == [3] * 3 + [7] * 6
    group = first.stats["group"].to_numpy().copy()
    rotation = first.stats["transform"].str.split("+").str[0].to_numpy().copy()
    for move in moves.itertuples():
        assert move.group != group[move.client]  # another ground-truth group
        assert move.transform.split("+")[0] == rotation[move.client]  # the rotation (no truth) stays
        group[move.client] = move.group
    # another partition seed draws other moves; the same seed, in the partition folder, the same
    other = build_partition(sc.model_copy(update={"seed": 1}), dataset)
    assert not other.moves.equals(moves)
    out = partition_scenario(spec, "rot")
    pd.testing.assert_frame_equal(pd.read_parquet(out / "drift.parquet"), moves)
    assert "drift.parquet" in (out / DIGESTS).read_text()


def test_a_moved_client_holds_its_new_groups_data_from_its_round_on(tmp_path):
    spec = parse_spec(raw_spec(tmp_path, [{"kind": "iid"}, {"kind": "label_swap", "groups": 3}]))
    run = prepare_run(spec, "rot", "ifca", 0)
    data = run.data
    move = data.moves[0]
    before_x, before_y = (t.clone() for t in data.client(move.client, "test"))
    assert data.drift_to(5) == [] and data.moved == 0
    applied = data.drift_to(6)
    assert [m.client for m in applied] == [m.client for m in data.moves] and data.moved == len(data.moves)
    x, y = data.client(move.client, "test")
    assert torch.equal(x, before_x) and not torch.equal(y, before_y)  # a label swap: same inputs, new labels
    assert data.groups[move.client] == move.group and data.transforms[move.client] == move.transform
    # the new labels are the new group's permutation of the same samples' labels
    sc = spec.scenarios["rot"]
    partition = build_partition(sc, load_dataset("digits", {}, spec.data_dir))
    rows = partition.clients[(partition.clients["client"] == move.client) & (partition.clients["split"] == "test")]
    dataset = load_dataset("digits", {}, spec.data_dir)
    original = dataset.pool_labels(sc.pool)[rows["sample"].to_numpy()]
    assert y.numpy().tolist() == apply_transform(np.zeros((len(original), 1)), original, move.transform)[1].tolist()


def test_a_run_reports_the_moved_clients_and_scores_the_current_truth(tmp_path):
    spec = parse_spec(raw_spec(tmp_path))
    runs = {m: train_run(spec, "rot", m, 0, progress=False).run_dir for m in ("fedavg", "ifca", "oracle")}
    summary = json.loads((runs["oracle"] / "summary.json").read_text())
    (event,) = summary["drift"]
    assert event["round"] == 6 and len(event["clients"]) == 3
    assert event["placed_with_group_final"] == 1.0 and event["rounds_to_place"] == [1, 1, 1]
    rounds = pd.read_parquet(runs["oracle"] / "rounds.parquet").dropna(subset=["acc_macro"])
    assert rounds["round"].tolist() == [5, 6, 10]  # the rounds before and at the move are evaluated
    assert (rounds["ari"] == 1.0).all()  # the oracle follows the truth as it is now
    clusters = pd.read_parquet(runs["oracle"] / "clusters.parquet")
    moved = clusters[clusters["client"].isin(event["clients"])]
    before, after = moved[moved["round"] == 5], moved[moved["round"] == 6]
    assert (before["true_group"].to_numpy() != after["true_group"].to_numpy()).all()
    table = pd.read_parquet(runs["ifca"] / "drift.parquet")
    assert set(table.columns) == {"round", "client", "moved", "group", "cluster", "placed_with_group", "acc"}
    assert table.loc[table["round"] == 5, "moved"].eq(False).all() and table.loc[table["round"] >= 6, "moved"].all()
    fedavg = pd.read_parquet(runs["fedavg"] / "rounds.parquet").dropna(subset=["acc_macro"])
    assert fedavg["drift_joined"].isna().all()  # no clusters: nothing to say
    assert fedavg[["moved_acc_macro", "unmoved_acc_macro"]].notna().all().all()


@pytest.mark.parametrize("drift, extra, line", [
    ([{"round": 3, "fraction": 1.0}], {}, "scenarios.a.drift[0].fraction: must be < 1, got 1.0"),
    ([{"round": 3, "fraction": 0}], {}, "scenarios.a.drift[0].fraction: must be > 0, got 0"),
    ([{"round": 1, "fraction": 0.5}], {}, "scenarios.a.drift[0].round: must be >= 2, got 1"),
    ([{"round": 9, "fraction": 0.5}], {}, "scenarios.a.drift[0].round: must be <= the rounds of its runs "
                                          "(training.rounds: 4), got 9"),
    ([{"round": 3, "fraction": 0.5}, {"round": 3, "fraction": 0.5}], {}, "the events' rounds must increase"),
    ([{"round": 3, "fraction": 0.5}], {"partition": [{"kind": "iid"}]}, "this partition has no two"),
    ([{"round": 3, "fraction": 0.5}], {"partition": [{"kind": "iid"}, {"kind": "rotation", "groups": 2},
                                                     {"kind": "mixture", "alpha": 1}]}, "without a mixture step"),
    ([{"round": 3, "fraction": 0.5}], {"new_clients": 0.3}, "not with new_clients in one scenario"),
])
def test_bad_drift_values_are_one_line_at_validate(drift, extra, line):
    scenario = {"dataset": "digits", "clients": 6, "drift": drift,
                "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}], **extra}
    raw = {"seeds": [0], "training": {"model": "mlp", "rounds": 4, "clients_per_round": 3},
           "scenarios": {"a": scenario}, "methods": {"fedavg": {}}}
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    assert line in str(err.value)


def test_validate_says_a_late_drift_in_one_line(tmp_path):
    assert validate_refuses(tmp_path, raw_spec(tmp_path, drift=[{"round": 11, "fraction": 0.25}])).endswith(
        "scenarios.rot.drift[0].round: must be <= the rounds of its runs (training.rounds: 10), got 11")


def test_the_report_draws_each_drift_scenario_and_tables_what_the_moved_clients_end_with(tmp_path):
    from cflpipe.report.aggregate import aggregate
    from cflpipe.report.build import build_report

    raw = raw_spec(tmp_path, rounds=8)
    raw["methods"] = {"fedavg": {}, "ifca": {}}
    raw["scenarios"]["still"] = {**raw["scenarios"]["rot"], "drift": None}
    spec = parse_spec(raw)
    for scenario in ("rot", "still"):
        for method in ("fedavg", "ifca"):
            train_run(spec, scenario, method, 0, progress=False)
    aggregate(spec)
    page = build_report(spec).read_text()
    section = page[page.index('<section id="drift">'):]
    section = section[:section.index("</section>")]
    assert 'id="drift-rot"' in section and 'id="drift-still"' not in section
    assert "Moved: 3 of 12 clients in round 6." in section and section.count('<figure class="fig">') == 3
    assert '<a href="#drift">' in page  # in the page's contents
    md = (build_report(spec).parent / "tables" / "summary.md").read_text()
    table = md[md.index("**Groups that change: moved clients placed"):]
    table = table[:table.index("\n\n", table.index("| method"))]
    assert "ifca" in table and "fedavg" in table
    maps = (build_report(spec).parent / "tables" / "robustness.md").read_text()  # the change is a map axis
    assert "3 move in round 6" in maps and "none" in maps


def test_a_client_that_moves_twice_is_followed_by_each_event_until_its_next_move():
    from types import SimpleNamespace

    from cflpipe.fl.axes.drift import summary

    data = SimpleNamespace(moves=[SimpleNamespace(round=3, client=0), SimpleNamespace(round=3, client=1),
                                  SimpleNamespace(round=6, client=0)])
    rows = [(r, c, acc, placed) for r, c, acc, placed in (
        (2, 0, 0.9, np.nan), (3, 0, 0.5, 0.0), (5, 0, 0.8, 1.0), (6, 0, 0.4, 0.0), (8, 0, 0.7, 0.0),
        (2, 1, 0.9, np.nan), (3, 1, 0.6, 1.0), (5, 1, 0.9, 1.0), (6, 1, 0.9, 1.0), (8, 1, 0.9, 1.0))]
    table = pd.DataFrame(rows, columns=["round", "client", "acc", "placed_with_group"])
    first, second = summary(data, table)
    assert first["clients"] == [0, 1] and first["rounds_to_place"] == [3, 1]
    # client 0 counts for the first event until its second move: round 5, not 8
    assert first["moved_acc_final"] == pytest.approx((0.8 + 0.9) / 2)
    assert first["placed_with_group_final"] == 1.0
    assert second == {"round": 6, "clients": [0], "moved_acc_before": 0.8, "moved_acc_after": 0.4,
                      "moved_acc_final": 0.7, "placed_with_group_final": 0.0, "rounds_to_place": [None]}


def test_one_validate_pass_reports_every_problem_of_a_scenario(tmp_path):
    """Every drift event past the rounds and a clients_per_round past the clients, in one pass (the
    checks across layers stopped at the first), each line once whatever the number of methods."""
    raw = {"seeds": [0], "training": {"model": "mlp", "rounds": 5, "clients_per_round": 9, "local_steps": 2},
           "scenarios": {"s": {"dataset": "digits", "clients": 8,
                               "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}],
                               "drift": [{"round": 9, "fraction": 0.2}, {"round": 12, "fraction": 0.2}]}},
           "methods": {"fedavg": {}, "ifca": {}}}
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    assert str(err.value).splitlines() == [
        "scenarios.s.drift[0].round: must be <= the rounds of its runs (training.rounds: 5), got 9",
        "scenarios.s.drift[1].round: must be <= the rounds of its runs (training.rounds: 5), got 12",
        "training.clients_per_round: must be <= clients of scenario s (8), got 9"], str(err.value)


def test_the_headline_says_who_serves_new_clients_and_movers_best(tmp_path):
    """"At a glance" (glance.txt and the page), the Setup table, the scenario cards and DVC's
    metrics.json carry both evaluation axes where a scenario has them, and only there."""
    from cflpipe.report.aggregate import aggregate
    from cflpipe.report.build import build_report

    raw = raw_spec(tmp_path, rounds=8, eval_every=4, clients_per_round=9)
    raw["methods"] = {"fedavg": {}, "ifca": {}}
    raw["scenarios"]["new"] = {**raw["scenarios"]["rot"], "drift": None, "new_clients": 0.25}
    spec = parse_spec(raw)
    for scenario in ("rot", "new"):
        for method in ("fedavg", "ifca"):
            train_run(spec, scenario, method, 0, progress=False)
    out = aggregate(spec)
    page = build_report(spec)
    lines = (page.parent / "glance.txt").read_text().splitlines()
    moved = [line for line in lines if line.startswith("rot: best moved clients' accuracy at the end ")]
    new = [line for line in lines if line.startswith("new: best new clients' accuracy ")]
    assert len(moved) == 1 and len(new) == 1, lines
    assert "placed with their new group" in moved[0] and "rounds to place" in moved[0] and "runner-up" in moved[0]
    assert "placed with their group" in new[0] and not any(line.startswith("rot: best new") for line in lines)
    metrics = json.loads((out / "metrics.json").read_text())
    runs = pd.read_parquet(out / "runs.parquet").set_index(["scenario", "method"])
    for method in ("fedavg", "ifca"):
        assert "moved_acc" in metrics["rot"][method] and "new_acc" not in metrics["rot"][method]
        assert "new_acc" in metrics["new"][method] and "moved_acc" not in metrics["new"][method]
        assert metrics["rot"][method]["moved_acc"] == round(runs.loc[("rot", method), "moved_acc_macro"], 4)
    # where a clustering places them (FedAvg has none: no share, no line part)
    assert {"moved_joined", "rounds_to_place"} <= set(metrics["rot"]["ifca"]) and "new_joined" in metrics["new"]["ifca"]
    assert "moved_joined" not in metrics["rot"]["fedavg"] and "(placed" not in moved[0].split("runner-up")[1]
    html = page.read_text()
    glance = html[html.index('<section id="glance">'):html.index('<section id="setup">')]
    assert glance.count('<tr class="axis">') == 2
    setup = html[html.index('id="setup-scenarios"'):html.index('id="setup-methods"')]
    assert "3 of 12 clients held out" in setup and "3 of 12 clients in round 6" in setup
    overview = html[html.index('<section id="overview">'):]
    assert "<dt>new clients</dt>" in overview and "<dt>groups that change</dt>" in overview
