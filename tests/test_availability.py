"""Clients that go away (scenario availability, fl/axes/availability.py): the seeded schedule and
its rules, away clients never sampled, what a run reports of their return, validate's lines, the
report's tables. The conformance suite's check_changing_clients_resume runs every method with two
clients away."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from cflpipe.errors import SpecError
from cflpipe.fl.axes.availability import AvailabilitySettings, recovered_after, schedule
from cflpipe.fl.engine import prepare_run, train_run
from cflpipe.spec import parse_spec
from conftest import validate_refuses

torch.set_num_threads(1)


def raw_spec(tmp_path, availability=None, **training) -> dict:
    return {
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 12, "clients_per_round": 6, "local_steps": 5, "batch_size": 32,
                     "lr": 0.05, "eval_every": 4, "trainer": "sequential", **training},
        "scenarios": {"rot": {"dataset": "digits", "clients": 12, "hyperparams": {"clusters": 3},
                              "partition": [{"kind": "iid"}, {"kind": "rotation", "groups": 3}],
                              "availability": availability or {"share": 0.5, "away": 3, "stretches": 2}}},
        "methods": {"fedavg": {}, "ifca": {}},
        "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data")}


@pytest.mark.parametrize("share, away, stretches, rounds", [
    (0.5, 3, 2, 12), (0.2, 1, 1, 3), (0.9, 4, 3, 16), (0.3, 2, 4, 40), (0.01, 10, 1, 12)])
def test_the_schedule_is_seeded_and_keeps_its_rules(share, away, stretches, rounds):
    settings = AvailabilitySettings(share=share, away=away, stretches=stretches)
    candidates = np.arange(0, 60, 2)  # not every client: a choice among those given
    rows = schedule(settings, candidates, rounds, seed=3)
    clients = np.unique(rows[:, 0])
    assert len(clients) == max(1, round(share * len(candidates))) and np.isin(clients, candidates).all()
    assert len(rows) == len(clients) * stretches
    assert (rows[:, 2] - rows[:, 1] + 1 == away).all()
    assert (rows[:, 1] >= 2).all() and (rows[:, 2] <= rounds - 1).all()  # present before, back before the end
    for c in clients:
        mine = rows[rows[:, 0] == c]
        assert (mine[1:, 1] >= mine[:-1, 2] + 2).all()  # a round present between two stretches
    assert np.array_equal(rows, schedule(settings, candidates, rounds, seed=3))
    if len(clients) > 1 or rounds > settings.rounds_needed():
        assert not np.array_equal(rows, schedule(settings, candidates, rounds, seed=4))


def test_the_stretches_start_anywhere_the_rules_allow():
    settings = AvailabilitySettings(share=0.5, away=2, stretches=1)
    starts = np.concatenate([schedule(settings, np.arange(40), 10, seed)[:, 1] for seed in range(30)])
    assert set(starts.tolist()) == set(range(2, 9))  # rounds 2..8: one present before, back by round 10


def test_away_clients_are_never_sampled_and_are_followed_when_they_return(tmp_path):
    spec = parse_spec(raw_spec(tmp_path))
    run = prepare_run(spec, "rot", "fedavg", 0)
    (axis,) = run.axes
    rows = axis.rows
    assert len(np.unique(rows[:, 0])) == 6
    sampled_counts = []
    for r in range(12):
        away = rows[(rows[:, 1] <= r + 1) & (r + 1 <= rows[:, 2]), 0]
        sampled = run.sample(r)
        assert not np.isin(sampled, away).any()
        sampled_counts.append(len(sampled))
        assert len(sampled) == min(6, 12 - len(np.unique(away)))
    train_run(spec, "rot", "fedavg", 0, progress=False)
    folder = spec.run_dir("rot", "fedavg", 0)
    table = pd.read_parquet(folder / "availability.parquet")
    assert pd.read_parquet(folder / "rounds.parquet")["sampled"].tolist() == sampled_counts
    for i, (client, start, end) in enumerate(rows):
        mine = table[table["stretch"] == i]
        assert (mine["client"] == client).all()
        assert mine.loc[mine["phase"] == "before", "round"].tolist() == [start - 1]
        back = mine[mine["phase"] == "back"]
        assert back["round"].iloc[0] == end and back["since_return"].iloc[0] == 0
        assert np.array_equal(back["since_return"], back["round"] - end)  # every round after, until served as well
    summary = json.loads((folder / "summary.json").read_text())["availability"]
    stretches = summary["stretches"]
    assert [(s["client"], s["start"], s["back"]) for s in stretches] == [(c, s, e + 1) for c, s, e in rows.tolist()]
    recovered = [s["rounds_to_recover"] for s in stretches if s["rounds_to_recover"] is not None]
    assert summary["returning_recovered"] == pytest.approx(len(recovered) / len(stretches))
    assert summary["returning_acc"] == pytest.approx(np.mean([s["acc_on_return"] for s in stretches]))


def test_a_stretch_recovers_at_the_first_evaluation_as_good_as_before():
    table = {"round": [3, 7, 8, 9, 10], "client": [4] * 5, "stretch": [0] * 5,
             "phase": ["before", "back", "back", "back", "back"], "since_return": [-1, 0, 1, 2, 3],
             "acc": [0.6, 0.3, 0.5, 0.6, 0.4]}
    assert recovered_after(table, 0) == 2  # equal counts: "as well as before"
    table["acc"][3] = 0.59
    assert recovered_after(table, 0) is None
    assert recovered_after(table, 1) is None  # a stretch without rows yet


def test_the_run_follows_no_one_further_once_served_as_well(tmp_path):
    """A stretch that recovered is not evaluated again; one that never does is followed until the
    run's end (or the client's next stretch)."""
    spec = parse_spec(raw_spec(tmp_path, availability={"share": 0.5, "away": 2}))
    train_run(spec, "rot", "ifca", 0, progress=False)
    folder = spec.run_dir("rot", "ifca", 0)
    table = pd.read_parquet(folder / "availability.parquet")
    stretches = json.loads((folder / "summary.json").read_text())["availability"]["stretches"]
    for i, stretch in enumerate(stretches):
        back = table[(table["stretch"] == i) & (table["phase"] == "back")]
        if stretch["rounds_to_recover"] is None:
            assert back["round"].max() == 12
        else:
            assert back["since_return"].max() == stretch["rounds_to_recover"]


@pytest.mark.parametrize("availability, line", [
    ({"share": 1.0, "away": 2}, "scenarios.a.availability.share: must be < 1, got 1.0"),
    ({"share": 0.5, "away": 0}, "scenarios.a.availability.away: must be >= 1, got 0"),
    ({"share": 0.5}, "scenarios.a.availability.away: is required"),
    ({"share": 0.5, "away": 2, "gone": 1}, "scenarios.a.availability.gone"),
    ({"share": 0.5, "away": 2, "stretches": 2}, "scenarios.a.availability.away: 2 stretches of 2 rounds need at "
                                                "least 7 rounds (a round present before each, one between them, one "
                                                "to come back in), and training.rounds is 4; allowed: stretches <= 1 at "
                                                "away 2"),
    ({"share": 0.5, "away": 4}, "training.rounds is 4; allowed: away <= 2 at 1 stretch"),
    ({"share": 0.5, "away": 3, "stretches": 2}, "and training.rounds is 4; allowed: 9 rounds or more"),
])
def test_bad_availability_values_are_one_line_at_validate(availability, line):
    scenario = {"dataset": "digits", "clients": 6, "availability": availability}
    raw = {"seeds": [0], "training": {"model": "mlp", "rounds": 4, "clients_per_round": 3},
           "scenarios": {"a": scenario}, "methods": {"fedavg": {}}}
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    assert line in str(err.value)


def test_validate_says_a_long_absence_in_one_line(tmp_path):
    assert validate_refuses(tmp_path, raw_spec(tmp_path, availability={"share": 0.25, "away": 11})).endswith(
        "scenarios.rot.availability.away: 1 stretch of 11 rounds need at least 13 rounds (a round present before "
        "each, one between them, one to come back in), and training.rounds is 12; allowed: away <= 10 at 1 stretch")


def test_the_report_tables_what_returning_clients_are_served(tmp_path):
    from cflpipe.report.aggregate import aggregate
    from cflpipe.report.build import build_report

    raw = raw_spec(tmp_path, rounds=9)
    raw["scenarios"]["still"] = {**raw["scenarios"]["rot"], "availability": None}
    spec = parse_spec(raw)
    for scenario in ("rot", "still"):
        for method in ("fedavg", "ifca"):
            train_run(spec, scenario, method, 0, progress=False)
    aggregate(spec)
    report = build_report(spec)
    page = report.read_text()
    assert "clients that go away" in page and "6 of 12 clients away 2 times for 3 rounds (seeded per run seed; of those" in page
    md = (report.parent / "tables" / "summary.md").read_text()
    for title in ("personalized accuracy (%) of what each method serves them when they come back",
                  "rounds trained after their return until served as well as before",
                  "share served as well as before they left"):
        table = md[md.index(title):]
        table = table[:table.index("\n\n", table.index("| method"))]
        assert "ifca" in table and "fedavg" in table
    metrics = json.loads((report.parent.parent / "aggregate" / "metrics.json").read_text())
    assert "returning_acc" in metrics["rot"]["ifca"] and "returning_acc" not in metrics["still"]["ifca"]


class _FakeRun:
    """What the axis reads of a run: its tables, extend, and the served accuracy by round."""

    def __init__(self, accuracy: dict[int, float]):
        self.tables, self.accuracy = {}, accuracy

    def extend(self, table, columns):
        for key, values in columns.items():
            self.tables[table].setdefault(key, []).extend(values)

    def served_accuracy(self, clients, round_number):
        return np.full(len(clients), self.accuracy[round_number])


def test_a_stretch_is_followed_up_to_the_round_before_the_next_one():
    """Stretches in rounds 2–3 and 5–6 with round 4 present between: the first recovers at round
    4 (one round after its return), which is also the second's "before"."""
    from cflpipe.fl.axes.availability import Availability

    axis = Availability(AvailabilitySettings(share=0.5, away=2, stretches=2))
    axis.rows = np.array([[0, 2, 3], [0, 5, 6]])
    axis.follows, axis.next_start = True, np.array([5, 9])
    run = _FakeRun({1: 0.5, 2: 0.1, 3: 0.3, 4: 0.9, 5: 0.1, 6: 0.2, 7: 0.95, 8: 0.99})
    for r in range(1, 9):
        axis.after_round(run, r)
    table = run.tables["availability"]
    assert recovered_after(table, 0) == 1 and recovered_after(table, 1) == 1
    assert list(zip(table["round"], table["stretch"], table["phase"])) == [
        (1, 0, "before"), (3, 0, "back"), (4, 1, "before"), (4, 0, "back"), (6, 1, "back"), (7, 1, "back")]


def test_one_client_always_stays_and_one_participant_is_refused():
    rows = schedule(AvailabilitySettings(share=0.9, away=2), np.arange(4), 4, seed=0)
    assert len(np.unique(rows[:, 0])) == 3  # round(0.9 · 4) = 4 would leave no one to train
    scenario = {"dataset": "digits", "clients": 1, "availability": {"share": 0.5, "away": 1}}
    with pytest.raises(SpecError) as err:
        parse_spec({"seeds": [0], "training": {"model": "mlp", "rounds": 4, "clients_per_round": 1},
                    "scenarios": {"a": scenario}, "methods": {"fedavg": {}}})
    assert "scenarios.a.availability: keeps clients away while others train, and the scenario has 1 participant" \
        in str(err.value)


def test_a_run_that_reads_no_test_split_keeps_clients_away_and_follows_none(tmp_path):
    from cflpipe.spec import MethodEntry

    raw = raw_spec(tmp_path)
    raw["scenarios"]["rot"]["validation_fraction"] = 0.2  # what such a run reads instead
    # as tuning makes its trials (Spec.tuning_view): eval_test false is not a spec's own to set
    spec = parse_spec(raw)
    spec = spec.model_copy(update={"methods": {"fedavg": MethodEntry(method="fedavg", training={"eval_test": False})}})
    run = prepare_run(spec, "rot", "fedavg", 0)
    (axis,) = run.axes
    away = axis.rows[(axis.rows[:, 1] <= 3) & (3 <= axis.rows[:, 2]), 0]
    assert len(away) and not np.isin(run.sample(2), away).any()
    train_run(spec, "rot", "fedavg", 0, progress=False)
    folder = spec.run_dir("rot", "fedavg", 0)
    assert not (folder / "availability.parquet").exists()
    assert "availability" not in json.loads((folder / "summary.json").read_text())
