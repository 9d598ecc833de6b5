"""The robustness map: every scenario with ground-truth groups a cell, placed by what the
scenario says (group transforms, skew inside them, participation, local budget); every clustered
method a row under the references; ARI and accuracy per cell from the runs, in the report and
as tables/robustness.{md,csv}."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cflpipe.report.tables import ONE_CLUSTER_MARK
from cflpipe.spec import parse_spec

from conftest import train_spec


def spec_data(root, scenarios=None) -> dict:
    cell = {"dataset": "digits", "clients": 8, "hyperparams": {"clusters": 2}}
    return {
        "seeds": [0], "results_dir": str(root / "results"), "data_dir": "resources/datasets",
        "training": {"model": "mlp", "rounds": 2, "clients_per_round": 8, "local_steps": 2, "batch_size": 16,
                     "lr": 0.05, "eval_every": 1, "device": "cpu"},
        "scenarios": scenarios or {
            "swap-iid": {**cell, "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]},
            "swap-iid-again": {**cell, "label": "another draw", "seed": 1,
                               "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]},
            "swap-dir": {**cell, "partition": [{"kind": "dirichlet", "alpha": 0.3}, {"kind": "label_swap", "groups": 2}],
                         "training": {"clients_per_round": 4}},
            "rot-iid": {**cell, "partition": [{"kind": "iid"}, {"kind": "rotation", "groups": 2}],
                        "training": {"local_steps": 5}},
            "no-groups": {"dataset": "digits", "clients": 8, "partition": [{"kind": "dirichlet", "alpha": 0.3}]},
        },
        "methods": {"fedavg": {}, "oracle": {"scenarios": ["swap-iid", "swap-iid-again", "swap-dir", "rot-iid"]},
                    "ifca": {},
                    "fesem": {}, "cfl": {"warmup": 0, "eps1": 1e-6, "thresholds": "absolute"},
                    "fedtsdp": {"scenarios": ["no-groups"]}},
    }


def build(root, data):
    from cflpipe.report.aggregate import aggregate
    from cflpipe.report.build import build_report

    spec = parse_spec(data)
    train_spec(spec)
    aggregate(spec)
    return spec, build_report(spec)


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    root = tmp_path_factory.mktemp("map")
    data = spec_data(root)
    data["scenarios"]["no-groups"]["pool"] = "train"
    data["scenarios"]["no-groups"]["public"] = {"source": "test", "size": 40}
    return build(root, data)


def test_cells_are_placed_by_what_their_scenarios_say(mapped):
    from cflpipe.report.aggregate import read_aggregate
    from cflpipe.report.robustness import cell_coordinates, robustness_map
    from cflpipe.report.view import AggregateView

    spec, _ = mapped
    view = AggregateView(spec, read_aggregate(spec))
    assert cell_coordinates(view, "swap-iid") == {"groups": "2 label swap", "skew": "IID", "participation": "all",
                                                  "budget": "2 steps", "change": "none"}
    assert cell_coordinates(view, "swap-dir") == {"groups": "2 label swap", "skew": "Dir 0.3",
                                                  "participation": "4 of 8", "budget": "2 steps", "change": "none"}
    assert cell_coordinates(view, "rot-iid")["groups"] == "2 rotation"
    rmap = robustness_map(view)
    assert rmap.scenarios == ["swap-iid", "swap-iid-again", "swap-dir", "rot-iid"]  # no cell without groups
    # two cells at the same coordinates are told apart by their labels
    assert rmap.column_label("swap-iid") == "2 label swap · IID · all · 2 steps · swap-iid"
    assert rmap.column_label("swap-iid-again") == "2 label swap · IID · all · 2 steps · another draw"
    assert rmap.column_label("rot-iid") == "2 rotation · IID · all · 5 steps"
    assert rmap.varying == ["groups", "skew", "participation", "budget"]
    assert rmap.references == ["oracle", "ifca", "fedavg"]
    assert rmap.rows()[:3] == ["oracle", "ifca", "fedavg"] and set(rmap.rows()[3:]) == {"fesem", "cfl"}
    assert "fedtsdp" not in rmap.rows()                                    # it ran on no cell
    for s in rmap.scenarios:
        for m in ("ifca", "fesem", "cfl"):
            final = json.loads((spec.run_dir(s, m, 0) / "summary.json").read_text())["final"]
            assert rmap.ari.loc[m, s] == pytest.approx(final["ari"])
            assert rmap.acc.loc[m, s] == pytest.approx(final["acc_macro"])
        assert rmap.degenerate.loc["cfl", s] == 1 and rmap.degenerate.loc["ifca", s] == 0


def test_the_report_draws_the_map_and_writes_it_as_tables(mapped):
    spec, page = mapped
    html = page.read_text()
    section = html[html.index('<section id="robustness">'):]
    section = section[:section.index("</section>")]
    assert section.count('class="cfl-fig"') >= 1 and "robustness" in section
    tables = page.parent / "tables"
    markdown = (tables / "robustness.md").read_text()
    assert markdown.startswith("**Robustness map: ARI / personalized accuracy (%)")
    assert "| cfl | 0.00 " + ONE_CLUSTER_MARK in markdown
    assert markdown.index("| oracle |") < markdown.index("| ifca |") < markdown.index("| fesem |")
    csv = pd.read_csv(tables / "robustness.csv")
    assert set(csv["scenario"]) == {"swap-iid", "swap-iid-again", "swap-dir", "rot-iid"}
    row = csv[(csv["method"] == "oracle") & (csv["scenario"] == "rot-iid")].iloc[0]
    assert row["ari"] == pytest.approx(1.0) and row["groups"] == "2 rotation" and row["seeds"] == 1
    assert (csv.loc[csv["method"] == "cfl", "no_clustering_seeds"] == 1).all()
    glance = html[html.index('<section id="glance">'):html.index('<section id="setup">')]
    assert "best ARI" in glance and "too few seeds to test (n = 1)" in glance


def test_no_map_without_two_grouped_scenarios(tmp_path):
    data = spec_data(tmp_path, scenarios={
        "swap": {"dataset": "digits", "clients": 8, "hyperparams": {"clusters": 2},
                 "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}})
    data["methods"] = {"fedavg": {}, "ifca": {}}
    spec, page = build(tmp_path, data)
    assert not (page.parent / "tables" / "robustness.md").exists()
    assert "no map: it needs two or more scenarios with ground-truth groups" in page.read_text()


def test_runs_written_before_the_diagnosis_are_diagnosed_when_aggregated(mapped):
    """A summary without degenerate_kind (cflpipe before it) is read from its rounds table."""
    from cflpipe.report.aggregate import RunOutputs, runs_frame

    spec, _ = mapped
    collapsed = pd.DataFrame({"round": [1, 2], "n_clusters": pd.array([2, 1], dtype="Int64")})
    old = {"clients": 8, "rounds": 2, "final": {"round": 2, "acc_macro": 0.5}, "degenerate": None}
    runs = [RunOutputs("swap-iid", m, 0, spec.run_dir("swap-iid", m, 0), dict(old), collapsed,
                       {"hyperparams": {"clusters": 2}}, {}) for m in ("ifca", "fedavg")]
    runs.append(RunOutputs("swap-iid", "fesem", 0, spec.run_dir("swap-iid", "fesem", 0),
                           {**old, "degenerate_kind": None}, collapsed, {"hyperparams": {"clusters": 2}}, {}))
    frame = runs_frame(spec, runs)
    assert list(frame["degenerate_kind"]) == ["collapsed", "", ""]   # not FedAvg; fesem's summary already said
    assert frame["degenerate"].iloc[0].startswith("collapsed to one cluster by the end")
