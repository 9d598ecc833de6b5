"""New clients (scenario new_clients): held out of training, placed at full evaluations by each
method's own rule, reported apart; validate's lines for bad values."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from cflpipe.errors import SpecError
from cflpipe.fl import engine
from cflpipe.fl.engine import prepare_run, train_run
from cflpipe.spec import parse_spec

torch.set_num_threads(1)


def spec(tmp_path, methods: dict, new_clients: float | None = 0.25, **training) -> object:
    scenario = {"dataset": "digits", "clients": 12, "hyperparams": {"clusters": 3},
                "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 3}]}
    if new_clients is not None:
        scenario["new_clients"] = new_clients
    return parse_spec({
        "seeds": [0, 1],
        "training": {"model": "mlp", "rounds": 10, "clients_per_round": 9, "local_steps": 10, "batch_size": 32,
                     "lr": 0.05, "eval_every": 5, "trainer": "sequential", **training},
        "scenarios": {"swap": scenario}, "methods": methods,
        "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data")})


def test_new_clients_never_train_and_are_placed_at_full_evaluations(tmp_path, monkeypatch):
    s = spec(tmp_path, {"ifca": {}})
    run = prepare_run(s, "swap", "ifca", 0)
    run.setup()
    (axis,) = run.axes
    chosen = axis.ids
    assert len(chosen) == 3 and run.data.num_clients == 9 and axis.data.num_clients == 3
    # the participants are the others, in id order: their rows are the scenario's clients' rows
    sampled = np.concatenate([run.sample(r) for r in range(10)])
    assert sampled.max() < 9  # drawn among the 9 participants only
    result = train_run(s, "swap", "ifca", 0, progress=False)
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["new_clients"] == chosen.tolist() and summary["clients"] == 9
    assert summary["final"]["new_ari"] == 1.0 and summary["final"]["new_placed"] == 1.0
    assert summary["final"]["new_joined"] == 1.0  # each with the participants of its group
    rows = pd.read_parquet(result.run_dir / "newcomers.parquet")
    assert rows["round"].tolist() == [5] * 3 + [10] * 3 and rows["client"].tolist() == chosen.tolist() * 2
    assert set(rows.columns) == {"round", "client", "cluster", "true_group", "acc", "n"}
    rounds = pd.read_parquet(result.run_dir / "rounds.parquet").dropna(subset=["acc_macro"])
    # IFCA's placement: 3 clients receive K = 3 models and send 3 losses each; nothing more
    size = rounds["bytes_down"].iloc[0] / 9 / 3  # every sampled client receives the 3 models
    assert (rounds["new_bytes_down"] == 3 * 3 * size).all() and (rounds["new_bytes_up"] == 3 * 3 * 4).all()


def test_the_new_clients_follow_the_seed_and_a_sampled_evaluation_places_none(tmp_path):
    s = spec(tmp_path, {"fedavg": {}, "ifca": {}}, eval_clients=4, full_eval_every=10)
    first, second = (prepare_run(s, "swap", "fedavg", seed) for seed in (0, 1))
    first.setup()
    second.setup()
    assert not np.array_equal(first.axes[0].ids, second.axes[0].ids)
    rounds = pd.read_parquet(train_run(s, "swap", "fedavg", 0, progress=False).run_dir / "rounds.parquet")
    evaluated = rounds.dropna(subset=["acc_macro"]).set_index("round")
    assert np.isnan(evaluated.loc[5, "new_acc_macro"]) and not np.isnan(evaluated.loc[10, "new_acc_macro"])


@pytest.mark.parametrize("method", ["fedgroup", "fedem"])  # FedEM's new clients carry their π
def test_a_run_with_new_clients_resumes_to_the_same_bytes(tmp_path, monkeypatch, method):
    s = spec(tmp_path, {method: {}}, checkpoint_every=5)
    reference = train_run(s, "swap", method, 0, progress=False).run_dir
    kept = {f.name: f.read_bytes() for f in reference.glob("*.parquet") if not f.name.startswith("timing")}
    other = spec(tmp_path / "again", {method: {}}, checkpoint_every=5)
    save = engine.Run.save_state

    class Killed(Exception):
        pass

    def save_then_die(self, round_number):
        save(self, round_number)
        if round_number == 5:
            raise Killed

    monkeypatch.setattr(engine.Run, "save_state", save_then_die)
    with pytest.raises(Killed):
        train_run(other, "swap", method, 0, progress=False)
    monkeypatch.undo()
    again = train_run(other, "swap", method, 0, progress=False).run_dir
    for name, data in kept.items():
        assert (again / name).read_bytes() == data, name


def test_the_mixtures_new_clients_carry_their_weights_from_one_placement_to_the_next(tmp_path):
    """FedEM's, FedRC's and FedGMM's rule (their authors' code): one E-step and one update of π per
    evaluation, from the π of the last one (uniform at the first); other methods keep nothing."""
    from cflpipe.fl.axes.newcomers import place

    for method in ("fedem", "fedrc", "fedgmm"):
        run = prepare_run(spec(tmp_path / method, {method: {}}), "swap", method, 0)
        run.setup()
        (axis,) = run.axes
        carried, fresh = {}, {}
        first = place(run.method, axis.ctx, 0, 1, 64, axis.placed, carried)[0]
        start = carried["pi"].clone()
        second = place(run.method, axis.ctx, 0, 1, 64, axis.placed, carried)[0]
        assert not torch.allclose(carried["pi"], start)  # the second step started from the first's π
        place(run.method, axis.ctx, 0, 1, 64, axis.placed, fresh)
        assert torch.equal(fresh["pi"], start)  # without it, every placement is the first step
        assert first["new_acc_macro"] == first["new_acc_macro"] and second["new_acc_macro"] == second["new_acc_macro"]
    run = prepare_run(spec(tmp_path / "ifca", {"ifca": {}}), "swap", "ifca", 0)
    run.setup()
    nothing = {}
    place(run.method, run.axes[0].ctx, 0, 1, 64, run.axes[0].placed, nothing)
    assert nothing == {} and run.axes[0].state() == {}


@pytest.mark.parametrize("share, clusters, per_round, line", [
    (1.5, 2, 3, "scenarios.a.new_clients: must be < 1, got 1.5"),
    (0.0, 2, 3, "scenarios.a.new_clients: must be > 0, got 0.0"),
    (0.5, 4, 3, "scenarios.a.hyperparams.clusters: must be <= clients of scenario a less its 3 new clients (3), got 4"),
    (0.5, 2, 5, "training.clients_per_round: must be <= clients of scenario a less its 3 new clients (3), got 5"),
    (0.95, 2, 1, "scenarios.a.new_clients: 0.95 of 6 clients holds out 6, leaving none to train"),
])
def test_bad_new_client_values_are_one_line_at_validate(share, clusters, per_round, line):
    raw = {"seeds": [0], "training": {"model": "mlp", "rounds": 2, "clients_per_round": per_round},
           "scenarios": {"a": {"dataset": "digits", "clients": 6, "new_clients": share,
                               "hyperparams": {"clusters": clusters},
                               "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
           "methods": {"ifca": {}}}
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    assert line in str(err.value)


def test_a_subclass_whose_clients_differ_is_not_given_its_parents_rule():
    """FedProx changes only its clients' pull and serves new clients as FedAvg does; a subclass
    with clients of its own has no rule until it states one."""
    from cflpipe.methods.fedavg import FedAvg
    from cflpipe.methods.fedprox import FedProx

    assert FedProx.place is FedAvg.place and FedProx.newcomer_rule == FedAvg.newcomer_rule

    class OwnClients(FedAvg):
        @classmethod
        def client_plan(cls, view, payload):
            return super().client_plan(view, payload)

    assert OwnClients.newcomer_rule == "" and OwnClients.place(None, None) is None


def test_ditto_and_per_fedavg_serve_a_new_client_a_model_of_its_own(tmp_path):
    s = spec(tmp_path, {"ditto": {}, "perfedavg": {}, "fedavg": {}, "ifca": {}})
    finals = {m: json.loads((train_run(s, "swap", m, 0, progress=False).run_dir / "summary.json").read_text())["final"]
              for m in ("ditto", "perfedavg", "fedavg")}
    # label-swapped new clients: the shared model serves them badly, a model adapted to their data well
    assert finals["ditto"]["new_acc_macro"] > finals["fedavg"]["new_acc_macro"] + 0.1  # 0.37 against 0.17
    assert finals["perfedavg"]["new_bytes_down"] == finals["fedavg"]["new_bytes_down"] > 0


def _no_rule():
    """A plugin's FedAvg whose clients are its own and which states no rule for new clients."""
    from cflpipe.methods import HyperParams, register
    from cflpipe.methods.fedavg import FedAvg

    @register("own_clients", HyperParams)
    class OwnClients(FedAvg):
        """Own clients: FedAvg whose client side is its own."""

        @classmethod
        def client_plan(cls, view, payload):
            return super().client_plan(view, payload)


def test_a_method_without_a_rule_reports_nan_and_no_rows(tmp_path, registry_copy):
    _no_rule()
    s = spec(tmp_path, {"own_clients": {}, "ifca": {}})
    run = train_run(s, "swap", "own_clients", 0, progress=False).run_dir
    assert json.loads((run / "summary.json").read_text())["final"]["new_acc_macro"] is None  # NaN: null
    assert not (run / "newcomers.parquet").exists()


def test_the_report_tables_what_each_method_serves_new_clients(tmp_path, registry_copy):
    from cflpipe.report.aggregate import aggregate
    from cflpipe.report.build import build_report

    _no_rule()
    s = spec(tmp_path, {"fedavg": {}, "ifca": {}, "own_clients": {}}, rounds=5)
    for method in ("fedavg", "ifca", "own_clients"):
        for seed in (0, 1):
            train_run(s, "swap", method, seed, progress=False)
    aggregate(s)
    report = build_report(s)
    md = (report.parent / "tables" / "summary.md").read_text()
    table = md[md.index("**New clients, never trained with"):]
    table = table[:table.index("\n\n", table.index("| method"))]
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in table.splitlines()[3:]}
    assert rows["own_clients"] == "—" and rows["ifca"] != "—" and rows["fedavg"] != "—"  # no rule: no figure
    assert "New clients placed in the cluster" in md


def test_docs_state_every_methods_rule_as_its_code_does():
    """docs/new-clients.md has one row per built-in method with the rule its class states."""
    from pathlib import Path

    import cflpipe.methods.catalog  # noqa: F401 (declares the built-ins)
    from cflpipe.registry import DECLARED

    docs = (Path(__file__).resolve().parents[1] / "docs" / "new-clients.md").read_text()
    for name, info in DECLARED.items():
        if info.base is None:
            assert f"| `{name}` | {info.cls.newcomer_rule} |" in docs, name


def test_a_group_whose_every_client_is_new_is_served_without_a_cluster(tmp_path):
    """Oracle has a model for each group its participants hold: a new client of a group held out
    entirely is served the groups' mean, in no cluster (seed 9 draws both clients of group 2)."""
    s = parse_spec({
        "seeds": [9], "training": {"model": "mlp", "rounds": 2, "clients_per_round": 4, "local_steps": 2,
                                   "eval_every": 1, "trainer": "sequential"},
        "scenarios": {"s": {"dataset": "digits", "clients": 6, "new_clients": 0.34,
                            "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 3}]}},
        "methods": {"oracle": {}}, "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data")})
    run = train_run(s, "s", "oracle", 9, progress=False).run_dir
    rows = pd.read_parquet(run / "newcomers.parquet")
    last = rows[rows["round"] == rows["round"].max()]
    assert (last["true_group"] == 2).all() and (last["cluster"] == -1).all()
    assert json.loads((run / "summary.json").read_text())["final"]["new_placed"] == 0.0


def test_stocfl_places_new_clients_under_the_numbers_its_participants_carry(tmp_path):
    """StoCFL names a cluster by a member's id; its placements are numbered as clusters.parquet's."""
    s = spec(tmp_path, {"stocfl": {}, "ifca": {}}, rounds=15)
    run = train_run(s, "swap", "stocfl", 0, progress=False).run_dir
    final = json.loads((run / "summary.json").read_text())["final"]
    rows = pd.read_parquet(run / "newcomers.parquet")
    clusters = pd.read_parquet(run / "clusters.parquet")
    last = clusters[clusters["round"] == clusters["round"].max()]
    placed = rows[rows["round"] == rows["round"].max()]
    assert set(placed["cluster"]) <= set(last["cluster"])
    assert final["new_ari"] == 1.0 and final["new_joined"] == 1.0


def test_where_full_evaluations_read_a_sample_the_new_clients_placed_are_as_large_a_share(tmp_path):
    """Placing a new client trains it a round: with a third of the 9 participants evaluated,
    one of the 3 new clients (seeded) is placed at each full evaluation, the same each time."""
    s = spec(tmp_path, {"ifca": {}}, full_eval_clients=3)
    result = train_run(s, "swap", "ifca", 0, progress=False)
    rows = pd.read_parquet(result.run_dir / "newcomers.parquet")
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert len(summary["new_clients"]) == 3 and sorted(rows["round"].unique()) == [5, 10]
    placed = rows.groupby("round")["client"].apply(list).tolist()
    assert placed[0] == placed[1] and len(placed[0]) == 1 and placed[0][0] in summary["new_clients"]
    rounds = pd.read_parquet(result.run_dir / "rounds.parquet").dropna(subset=["acc_macro"])
    assert rounds["evaluated_clients"].tolist() == [3, 3] and rounds["new_acc_macro"].notna().all()
    every = pd.read_parquet(train_run(spec(tmp_path / "every", {"ifca": {}}), "swap", "ifca", 0,
                                      progress=False).run_dir / "newcomers.parquet")
    assert len(every[every["round"] == 10]) == 3


def test_placed_with_their_group_counts_every_cluster_tied_for_most():
    """Group 0's participants split 2–2 between clusters 0 and 1: a new client of group 0 in either is
    with its group (the lower id alone was, before); in cluster 2, group 1's, it is not."""
    from cflpipe.fl.axes.placement import with_their_group

    held, held_groups = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 0, 0, 0, 1, 1])
    out = with_their_group(held, held_groups, clusters=np.array([0, 1, 2, 2, -1]), groups=np.array([0, 0, 0, 1, 1]))
    np.testing.assert_array_equal(out, [1.0, 1.0, 0.0, 1.0, np.nan])
    # no tie: only the cluster holding most
    out = with_their_group(np.array([0, 0, 1, 2]), np.array([0, 0, 0, 1]), np.array([0, 1]), np.array([0, 0]))
    np.testing.assert_array_equal(out, [1.0, 0.0])
