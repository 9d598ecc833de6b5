"""No silent FedAvg: a clustered method that cannot or did not cluster says so — `validate`
warns before the run, the run writes why into summary.json and prints one line, and the tables
mark its cells instead of dropping it from the ARI table."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from cflpipe.cli import main
from cflpipe.fl.diagnosis import diagnose_clustering
from cflpipe.fl.engine import train_run
from cflpipe.report.tables import ARI, ONE_CLUSTER_MARK, paper_table, paper_tables, to_latex, to_markdown
from cflpipe.spec import parse_spec, spec_warnings


def spec_dict(tmp_path, methods: dict, rounds: int = 3, **sc) -> dict:
    return {
        "seeds": [0],
        "training": {"model": "mlp", "rounds": rounds, "clients_per_round": 6, "local_steps": 3, "batch_size": 16,
                     "lr": 0.05, "eval_every": 1, "device": "cpu"},
        "scenarios": {"s": {"dataset": "digits", "clients": 6, "pool": "train",
                            "public": {"source": "test", "size": 50},
                            "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}], **sc}},
        "methods": methods,
        "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data"),
    }


def test_validate_warns_when_a_scenario_runs_far_below_its_datasets_typical_budget(tmp_path):
    """MNIST-1D's stated budget is 50 rounds: 25 or fewer warn once per scenario, naming the key,
    the dataset and the evidence; 26 and datasets without a measured budget stay quiet."""
    methods = {"fedavg": {}, "fedprox": {"mu": 0.1}}
    one_d = {"dataset": "mnist1d", "partition": [{"kind": "iid"}], "pool": "all", "public": None}
    lines = spec_warnings(parse_spec(spec_dict(tmp_path, methods, rounds=25, **one_d)))
    assert len(lines) == 1 and lines[0].startswith(
        "training.rounds: 25 on scenario s is half or less of mnist1d's typical budget of 50 rounds (FedAvg "), lines
    assert spec_warnings(parse_spec(spec_dict(tmp_path, methods, rounds=26, **one_d))) == []
    # the key that gives the fewest rounds is named: here a method's own training block
    methods["fedprox"]["training"] = {"rounds": 10}
    lines = spec_warnings(parse_spec(spec_dict(tmp_path, methods, rounds=40, **one_d)))
    assert len(lines) == 1 and lines[0].startswith("methods.fedprox.training.rounds: 10 on scenario s is half"), lines
    assert spec_warnings(parse_spec(spec_dict(tmp_path, methods, rounds=2))) == []  # digits: no stated budget


def test_validate_warns_naming_the_key_when_clustering_would_start_after_the_last_round(tmp_path, capsys):
    methods = {"fedavg": {}, "cfl": {}, "flhc": {"cluster_round": 14}, "kmeans_cfl": {"cluster_start": 16},
               "fesem": {"clusters": 2}, "ifca": {"clusters": 2}}
    lines = spec_warnings(parse_spec(spec_dict(tmp_path, methods, rounds=15)))
    assert len(lines) == 2, lines  # flhc clusters in its last round, kmeans_cfl's 15 is still in time
    assert lines[0].startswith("methods.cfl.warmup: 20 leaves no round to cluster in the 15 rounds of scenario s")
    assert lines[1].startswith("methods.kmeans_cfl.cluster_start: 16 leaves no round")
    assert "FedAvg" in lines[0]
    assert spec_warnings(parse_spec(spec_dict(tmp_path, methods, rounds=25))) == []
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_dict(tmp_path, methods, rounds=15)))
    assert main(["validate", "--config", str(path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1] for line in err] == [" methods.cfl.warmup", " methods.kmeans_cfl.cluster_start"]
    assert all(line.startswith("warning: ") for line in err)


@pytest.mark.slow
def test_a_run_that_never_clusters_says_so_and_one_that_clusters_does_not(tmp_path, capsys):
    methods = {"cfl": {"warmup": 0, "eps1": 1e-6, "thresholds": "absolute"},  # the mean update never gets that small
               "fedtsdp": {"hopkins_threshold": 0.999},          # H never passes it
               "ifca": {"clusters": 2}, "fesem": {"clusters": 1},  # K = 1 asks for one cluster
               "fedavg": {}}
    spec = parse_spec(spec_dict(tmp_path, methods))
    summaries = {m: train_run(spec, "s", m, 0, progress=False).summary for _, m, _ in spec.matrix()}
    err = capsys.readouterr().err
    assert summaries["cfl"]["degenerate"] == "never formed more than one cluster in an evaluated round"
    assert summaries["fedtsdp"]["degenerate"].startswith("never clustered: its Hopkins gate never opened")
    assert summaries["ifca"]["final"]["n_clusters"] == 2 and summaries["ifca"]["degenerate"] is None
    assert summaries["fesem"]["degenerate"] is None and summaries["fedavg"]["degenerate"] is None
    assert summaries["cfl"]["degenerate_kind"] == "one_cluster" and summaries["fedtsdp"]["degenerate_kind"] == "gate"
    warned = [line for line in err.splitlines() if line.startswith("warning: s/")]
    assert warned[0] == "warning: s/cfl/seed0: cfl never formed more than one cluster in an evaluated round"
    assert warned[1].startswith("warning: s/fedtsdp/seed0: fedtsdp never clustered: its Hopkins gate never opened "
                                "(H <= hopkins_threshold 0.999 in every round; largest H 0.")
    assert len(warned) == 2
    on_disk = json.loads((spec.run_dir("s", "cfl", 0) / "summary.json").read_text())
    assert on_disk["degenerate"] == summaries["cfl"]["degenerate"]
    # the report keeps them in the ARI table, marked, and says why in the clustering section
    from cflpipe.fl.data import partition_scenario
    from cflpipe.report.aggregate import aggregate
    from cflpipe.report.build import build_report

    partition_scenario(spec, "s")
    aggregate(spec)
    page = build_report(spec)
    markdown = (page.parent / "tables" / "summary.md").read_text()
    ari = markdown[markdown.index("**Adjusted Rand index"):]
    assert f"| cfl | 0.00 {ONE_CLUSTER_MARK} |" in ari and "| fedtsdp |" in ari and "| ifca |" in ari
    html = page.read_text()
    assert "cfl: no clustering in 1 of 1 seeds (never formed more than one cluster" in html


def per_seed(rows):
    return pd.DataFrame([{"scenario": "s", "method": m, "seed": k, "ari": a, "acc_macro": acc, "degenerate": d}
                         for m, k, a, acc, d in rows])


def test_tables_mark_a_method_that_never_clustered_and_keep_it_in_the_ari_table():
    frame = per_seed([("cfl", 0, 0.0, 0.5, "never formed more than one cluster"), ("cfl", 1, 0.8, 0.9, ""),
                      ("ifca", 0, 1.0, 0.9, ""), ("ifca", 1, 1.0, 0.9, "")])
    table = paper_table(frame, ["s"], ["cfl", "ifca"], ARI)
    assert table.cell("cfl", "s").text.endswith(ONE_CLUSTER_MARK) and table.cell("cfl", "s").one_cluster == 1
    assert ONE_CLUSTER_MARK not in table.cell("ifca", "s").text
    assert table.notes[-1].startswith(f"{ONE_CLUSTER_MARK} no clustering at the end (one cluster throughout or by "
                                      f"the end, about one cluster per client")
    assert table.notes[-1].endswith("cfl on s (1 of 2 seeds).")
    assert ONE_CLUSTER_MARK in to_markdown(table) and r"$^\ddagger$" in to_latex(table)
    tables = paper_tables(frame, ["s"], ["cfl", "ifca"], ari_methods=["cfl", "ifca"])
    assert [t.spec.figure for t in tables][-1] == "ari" and tables[-1].methods == ["cfl", "ifca"]
    quiet = paper_table(per_seed([("ifca", 0, 1.0, 0.9, "")]), ["s"], ["ifca"], ARI)
    assert not any(ONE_CLUSTER_MARK in note for note in quiet.notes)


def rounds_of(counts, **columns) -> pd.DataFrame:
    """A rounds table with the given n_clusters at evaluation rounds 5, 10, … and none between."""
    rows = []
    for index, count in enumerate(counts):
        rows += [{"round": 5 * index + r, "n_clusters": None} for r in range(1, 5)]
        rows.append({"round": 5 * index + 5, "n_clusters": count})
    frame = pd.DataFrame(rows, columns=["round", "n_clusters"])
    frame["n_clusters"] = frame["n_clusters"].astype("Int64")
    for name, values in columns.items():
        frame[name] = values
    return frame


def test_a_clustering_that_collapsed_by_the_end_is_named_with_the_round_it_last_had_clusters():
    found = diagnose_clustering(rounds_of([1, 3, 3, 2, 1, 1]), clients=18)
    assert found.kind == "collapsed"
    assert found.line.startswith("collapsed to one cluster by the end (it had 3 clusters; the last evaluated round "
                                 "with more than one was round 20)")


def test_about_one_cluster_per_client_at_the_end_is_local_in_disguise():
    found = diagnose_clustering(rounds_of([18, 18]), clients=18)
    assert found.kind == "singletons" and "(18 clusters for 18 clients)" in found.line and "Local" in found.line
    assert diagnose_clustering(rounds_of([1, 15]), clients=18).kind == "singletons"   # 15 >= 0.8 · 18
    assert diagnose_clustering(rounds_of([1, 14]), clients=18) is None                # 14 clusters are a clustering
    assert diagnose_clustering(rounds_of([3, 3]), clients=3) is None                  # too few clients to tell
    assert diagnose_clustering(rounds_of([4, 4]), clients=5, true_groups=4) is None   # as many as the true groups
    assert diagnose_clustering(rounds_of([5, 5]), clients=5, true_groups=4).kind == "singletons"


def test_most_clients_alone_at_the_end_is_marked_though_some_share_a_cluster():
    """19 clusters for 24 clients (17 alone, two pairs and a triple) is under the 0.8 share of
    'one cluster per client' and still Local for most clients; 13 alone of 24 is most, 12 is not."""
    found = diagnose_clustering(rounds_of([1, 19], singleton_clients=[None] * 9 + [17]), clients=24)
    assert found.kind == "singletons"
    assert found.line.startswith("ended with most clients in clusters of one (17 of 24 clients alone, 19 clusters)")
    assert diagnose_clustering(rounds_of([1, 12], singleton_clients=[None] * 9 + [13]), clients=24).kind == "singletons"
    assert diagnose_clustering(rounds_of([1, 12], singleton_clients=[None] * 9 + [12]), clients=24) is None
    assert diagnose_clustering(rounds_of([1, 12]), clients=24) is None  # a table from before the column
    # the final evaluation counts, not an earlier one
    assert diagnose_clustering(rounds_of([19, 4], singleton_clients=[None] * 4 + [17] + [None] * 4 + [0]),
                               clients=24) is None
    assert diagnose_clustering(rounds_of([19, 19], singleton_clients=[None] * 9 + [17]), clients=24,
                               true_groups=19) is None


def test_a_soft_methods_lines_say_it_still_predicts_with_every_component():
    collapsed = diagnose_clustering(rounds_of([3, 1]), clients=18, soft=True)
    assert collapsed.kind == "collapsed" and "largest share is in one component" in collapsed.line
    assert "FedAvg" not in collapsed.line and "one model for all" not in collapsed.line
    assert "one component" in diagnose_clustering(rounds_of([1, 1]), clients=18, soft=True).line


def test_a_good_clustering_and_one_that_clustered_late_stay_quiet():
    assert diagnose_clustering(rounds_of([3, 3, 3]), clients=18) is None
    assert diagnose_clustering(rounds_of([1, 1, 1, 4]), clients=18) is None   # a late split is a clustering
    assert diagnose_clustering(rounds_of([4, 10, 2]), clients=18) is None     # fewer clusters, still several
    assert diagnose_clustering(rounds_of([]), clients=18) is None             # nothing evaluated: nothing to say
    assert diagnose_clustering(rounds_of([1, 1]), clients=18).kind == "one_cluster"
    gate = diagnose_clustering(rounds_of([3, 3]), clients=18, gate_note="never clustered: its gate")
    assert (gate.kind, gate.line) == ("gate", "never clustered: its gate")


def test_fedtsdp_says_when_its_gate_opened_but_its_clustering_never_split(tmp_path):
    from types import SimpleNamespace

    from cflpipe.methods.fedtsdp import FedTSDP

    method = SimpleNamespace(hp=SimpleNamespace(hopkins_threshold=0.65))
    ran = [0.0] * 9 + [1.0]
    note = FedTSDP.gate_note(method, rounds_of([1, 1], clustering_ran=ran, hopkins=[0.6] * 9 + [0.7]))
    assert note == ("never clustered: its Hopkins gate opened in 1 of 10 rounds, but the two-stage clustering "
                    "never split the clients (one cluster in every evaluated round)")
    assert FedTSDP.gate_note(method, rounds_of([1, 3], clustering_ran=ran, hopkins=[0.7] * 10)) is None
    closed = FedTSDP.gate_note(method, rounds_of([1, 1], clustering_ran=[0.0] * 10, hopkins=[0.6] * 9 + [0.62]))
    assert closed == ("never clustered: its Hopkins gate never opened (H <= hopkins_threshold 0.65 in every round; "
                      "largest H 0.620)")


@pytest.mark.slow
def test_pacfl_whose_threshold_is_below_every_angle_says_it_left_every_client_alone(tmp_path):
    spec = parse_spec(spec_dict(tmp_path, {"pacfl": {}, "pacfl-k": {"method": "pacfl", "clusters": 2}},
                                partition=[{"kind": "iid"}, {"kind": "rotation", "groups": 2}]))
    alone = train_run(spec, "s", "pacfl", 0, progress=False).summary
    assert alone["degenerate_kind"] == "singletons" and alone["final"]["n_clusters"] == 6
    assert "threshold 4.9° is below the smallest angle between two clients' subspaces" in alone["degenerate"]
    assert train_run(spec, "s", "pacfl-k", 0, progress=False).summary["degenerate"] is None


def test_validate_warns_when_a_run_goes_against_a_methods_premises_and_only_then(tmp_path):
    methods = {"fcca": {}, "fcca-short": {"method": "fcca", "flow_steps": 4},
               "fcca-tied": {"method": "fcca", "flow_steps": None, "flow_epochs": None}, "pacfl": {}}
    swaps = spec_dict(tmp_path, methods)
    lines = spec_warnings(parse_spec(swaps))
    assert [line.split(":")[0] for line in lines] == ["methods.fcca-short.flow_steps", "methods.fcca-tied.flow_steps",
                                                      "methods.pacfl"]
    assert lines[0].startswith("methods.fcca-short.flow_steps: 4: FCCA clusters by what the cINN learns")
    assert "fewer than 10 (the paper's K is 20)" in lines[0]
    assert lines[1].startswith("methods.fcca-tied.flow_steps: null (flow_epochs null too: the run's 3 local steps)")
    assert "cannot tell them apart" in lines[2] and lines[2].endswith("(scenario s)")
    # the paper's budget through the run's own local steps, and groups PACFL can see: quiet
    swaps["training"]["local_steps"] = 20
    rotations = spec_dict(tmp_path, {"fcca-tied": {"method": "fcca", "flow_steps": None, "flow_epochs": None},
                                     "pacfl": {}},
                          partition=[{"kind": "iid"}, {"kind": "rotation", "groups": 2}])
    rotations["training"]["local_steps"] = 20
    assert spec_warnings(parse_spec(rotations)) == []
    # FCCA on label swaps under label skew stronger than Dirichlet 1.0; rotations and Dirichlet 1.0: quiet
    skewed = spec_dict(tmp_path, {"fcca": {}}, partition=[{"kind": "dirichlet", "alpha": 0.5},
                                                          {"kind": "label_swap", "groups": 2}])
    lines = spec_warnings(parse_spec(skewed))
    assert len(lines) == 1 and lines[0].startswith("methods.fcca: label-swap groups under Dirichlet 0.5 label skew: "
                                                   "FCCA's similarity D separates them only once"), lines
    skewed["scenarios"]["s"]["partition"][0]["alpha"] = 1.0
    assert spec_warnings(parse_spec(skewed)) == []
    skewed["scenarios"]["s"]["partition"][0] = {"kind": "pathological", "labels_per_client": 2}
    assert spec_warnings(parse_spec(skewed))[0].startswith("methods.fcca: label-swap groups under pathological")
    rotated = spec_dict(tmp_path, {"fcca": {}}, partition=[{"kind": "dirichlet", "alpha": 0.3},
                                                           {"kind": "rotation", "groups": 2}])
    assert spec_warnings(parse_spec(rotated)) == []
    # one line per premise, its scenarios listed
    two = spec_dict(tmp_path, {"pacfl": {}})
    two["scenarios"]["t"] = dict(two["scenarios"]["s"])
    assert spec_warnings(parse_spec(two))[0].endswith("(scenarios s, t)")


def test_validate_warns_when_awcfls_beta_makes_its_clusters_one_model(tmp_path):
    """AWCFL's Eq. 2 at β = (K−1)/K with a fixed K (K-means' clusters, IFCA's) is one averaged model."""
    methods = {"awcfl": {"clusters": 2, "beta": 0.5, "cluster_start": 1}, "ifca_awcfl": {"clusters": 4, "beta": 0.75},
               "quarter": {"method": "awcfl", "clusters": 2, "beta": 0.25, "cluster_start": 1}, "ifca": {"clusters": 2}}
    lines = spec_warnings(parse_spec(spec_dict(tmp_path, methods)))
    assert [line.split(":")[0] for line in lines] == ["methods.awcfl.beta", "methods.ifca_awcfl.beta"], lines
    assert "with 2 clusters, AWCFL's Eq. 2 at beta 0.5 = (K-1)/K gives every cluster the same model" in lines[0]
    assert "with 4 clusters" in lines[1] and "beta 0.75" in lines[1]
