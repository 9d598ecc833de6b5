"""Cross-device scale (#59): the memory-lean paths agree with the exact ones, the evaluation's
pooled-test sample, validate's warning for methods that need all pairs, and the scale bench."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.spatial.distance import pdist

from cflpipe import bench_scale
from cflpipe.clustering import hierarchical_clusters, tools
from cflpipe.fl import evaluation
from cflpipe.fl.engine import train_run
from cflpipe.spec import _checks, parse_spec, spec_warnings
from cflpipe.testing import spec_dict


def _blobs(n: int, p: int, groups: int = 3, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(groups, p))
    # a large common part, as model vectors have: distances must not cancel in float32
    return torch.from_numpy((100.0 + centres[np.arange(n) % groups] + rng.normal(size=(n, p))).astype(np.float32))


@pytest.mark.parametrize("n, p, block_rows, step_rows", [(2, 3, None, None), (7, 5, None, None),
                                                       (301, 700, None, None), (23, 9, 4, 3), (40, 6, 7, 1)])
def test_condensed_distances_are_scipys_pdist(monkeypatch, n, p, block_rows, step_rows):
    if block_rows:  # blocks of a few rows: every boundary between them is crossed
        monkeypatch.setattr(tools, "_LEAN_BLOCK_BYTES", 4 * p * block_rows)
        monkeypatch.setattr(tools, "_LEAN_STEP_BYTES", 4 * p * step_rows)
    x = _blobs(n, p)
    ours = tools._condensed_euclidean(x)
    reference = pdist(x.double().numpy())
    assert ours.shape == reference.shape
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6 * reference.max())


@pytest.mark.parametrize("cut", [{"n_clusters": 3}, {"distance_threshold": 60.0}])
def test_the_lean_dendrogram_cuts_where_the_square_one_does(monkeypatch, cut):
    x = _blobs(90, 400)
    square = hierarchical_clusters(x, **cut)
    monkeypatch.setattr(tools, "LEAN_PAIRWISE_BYTES", 0)
    lean = hierarchical_clusters(x, **cut)
    assert len(np.unique(square)) == 3
    np.testing.assert_array_equal(lean, square)


def _run(tmp_path, name: str, **training):
    spec = parse_spec(spec_dict(tmp_path / "runs", name, **training))
    train_run(spec, "s", name, 0, force=True, progress=False)
    run = spec.run_dir("s", name, 0)
    return (pd.read_parquet(run / "rounds.parquet"), pd.read_parquet(run / "clusters.parquet"))


def test_flhc_clusters_alike_on_the_lean_path(tmp_path, monkeypatch):
    rounds, clusters = _run(tmp_path / "square", "flhc")
    monkeypatch.setattr(tools, "LEAN_PAIRWISE_BYTES", 0)
    lean_rounds, lean_clusters = _run(tmp_path / "lean", "flhc")
    np.testing.assert_array_equal(lean_clusters["cluster"], clusters["cluster"])
    np.testing.assert_allclose(lean_rounds["flhc_mean_update_norm"].dropna(), rounds["flhc_mean_update_norm"].dropna(),
                               rtol=1e-5)


def test_scored_models_read_a_seeded_sample_of_the_pooled_test_rows_past_the_cap(tmp_path, monkeypatch):
    full, _ = _run(tmp_path / "full", "local")
    assert "global_rows" not in full.columns  # under the cap: every row, no column
    monkeypatch.setattr(evaluation, "MAX_SCORED_ROWS", 120)
    sampled, _ = _run(tmp_path / "sampled", "local")
    again, _ = _run(tmp_path / "again", "local")
    evaluated = sampled.dropna(subset=["global_acc_mean"])
    assert (evaluated["global_rows"] == 120 // 6).all()  # 6 clients' own models share the cap
    assert evaluated["global_models"].eq(6).all()
    pd.testing.assert_frame_equal(sampled.drop(columns=[c for c in sampled if "seconds" in c]),
                                  again.drop(columns=[c for c in again if "seconds" in c]))
    # the clients' own figures do not depend on the cap; the models' pooled accuracy is an estimate of it
    common = full.dropna(subset=["global_acc_mean"])
    # (the clients' rows come from another pass over the same models: equal but for the last bits)
    np.testing.assert_allclose(evaluated["acc_macro"], common["acc_macro"], rtol=1e-9)
    assert np.abs(evaluated["global_acc_mean"].to_numpy() - common["global_acc_mean"].to_numpy()).max() < 0.35


def test_validate_warns_where_all_pairs_pass_the_machines_memory(tmp_path, monkeypatch):
    spec = {"seeds": [0], "training": {"model": "mlp", "rounds": 20},
            "scenarios": {"big": {"dataset": {"name": "synthetic", "devices": 3000, "max_samples": 20},
                                  "clients": 3000, "partition": [{"kind": "natural"}]}},
            "methods": {"pacfl": {}, "fedavg": {}, "kmeans_cfl": {}}, "results_dir": str(tmp_path)}
    assert not [line for line in spec_warnings(parse_spec(spec)) if "memory" in line]
    monkeypatch.setattr(_checks, "machine_memory", lambda: 256 << 20)
    lines = [line for line in spec_warnings(parse_spec(spec)) if "memory" in line]
    assert len(lines) == 1 and lines[0].startswith("methods.pacfl: on scenario big holds the principal angle of "
                                                   "every pair of clients' subspaces"), lines
    # the long tables of pairs are of the 1,000 clients full evaluations read (full_eval_clients auto)
    assert "about 0.6 GiB for its 3,000 clients and 4 evaluations, more than this machine's 0.2 GiB" in lines[0]
    spec["training"]["full_eval_clients"] = "all"
    lines = [line for line in spec_warnings(parse_spec(spec)) if "memory" in line]
    assert "about 3.6 GiB for its 3,000 clients and 4 evaluations, more than this machine's 0.2 GiB" in lines[0]


def test_the_scale_table_and_exponents():
    rows = [{"method": "a", "clients": 100, "train_s": 1.0, "server_s": 0.1, "eval_s": 0.01, "peak_rss_mib": 400.0},
            {"method": "a", "clients": 10000, "train_s": 1.0, "server_s": 10.0, "eval_s": 1.0, "peak_rss_mib": 4000.0},
            {"method": "b", "clients": 100, "train_s": 1.0, "server_s": 0.1, "eval_s": 0.01, "peak_rss_mib": 400.0},
            {"method": "b", "clients": 10000, "stopped": "RSS over 8192 MiB", "peak_rss_mib": 8200.0}]
    slopes = bench_scale.exponents(rows)
    assert slopes["a"]["server_s"] == pytest.approx(1.0) and slopes["a"]["train_s"] == pytest.approx(0.0)
    assert "b" not in slopes  # one population measured to the end: no slope
    text = bench_scale.table(rows)
    assert "| a | 1.000 / 1.000 | 0.100 / 10.000 | – / – | 10.00 |" in text
    assert "| b | 1.000 / – |" in text and "400 / ≥8,200 (RSS over 8192 MiB)" in text


def _scale_folders() -> set:
    import tempfile
    from pathlib import Path

    return set(Path(tempfile.gettempdir()).glob("cflpipe-scale-*"))


def test_a_configuration_past_its_memory_limit_is_stopped_and_says_so():
    before = _scale_folders()
    row = bench_scale.measure("fedavg", {}, 20, rounds=2, limit_mib=1)
    assert row["stopped"] == "RSS over 1 MiB" and row["clients"] == 20
    assert _scale_folders() <= before  # the stopped process's data is gone with it


def test_a_configuration_that_fails_says_why_and_the_table_still_prints():
    row = bench_scale.measure("ifca", {"clusters": 4}, 2, rounds=3)
    assert row["stopped"].startswith("failed: ") and "clusters" in row["stopped"], row
    assert "| – | failed: " in bench_scale.table([row])
    assert bench_scale.table([]) == "(no configuration measured)"


def test_a_configuration_is_measured_in_a_fresh_process(tmp_path):
    row = bench_scale.measure("kmeans_cfl", {"clusters": 2, "cluster_start": 1}, 12, rounds=3, sampled=6,
                              training={"local_steps": 2, "batch_size": 8})
    assert "stopped" not in row, row
    assert row["train_s"] > 0 and row["server_s"] > 0 and row["eval_s"] > 0 and row["peak_rss_mib"] > 100
    json.dumps(row)


def test_the_setup_says_where_models_were_scored_on_a_sample_of_the_pooled_rows():
    from cflpipe.report.sections import _pooled_text

    assert _pooled_text([]) == ""
    assert _pooled_text([10000, 10000]) == (
        "; global and intra/inter accuracy of the models scored on the pooled test data from a seeded sample of "
        "10,000 of its rows")


def test_methods_name_says_what_keeps_a_method_from_the_bars_at_scale(capsys):
    from cflpipe.cli import main

    assert main(["methods", "flhc"]) == 0
    out = capsys.readouterr().out
    assert "\nat 10,000 clients: its one clustering trains every client and links all N updates pairwise" in out
    assert "\nmemory: the Euclidean distance of every pair of clients' updates" in out
    assert main(["methods", "fedem"]) == 0
    out = capsys.readouterr().out
    assert "at 10,000 clients" not in out and "memory:" not in out


def test_pairs_of_a_rounds_clients_are_weighed_at_the_rounds_clients(tmp_path, monkeypatch):
    spec = {"seeds": [0], "training": {"model": "mlp", "rounds": 20, "clients_per_round": 3000},
            "scenarios": {"big": {"dataset": {"name": "synthetic", "devices": 3000, "max_samples": 20},
                                  "clients": 3000, "partition": [{"kind": "natural"}]}},
            "methods": {"cfl": {}}, "results_dir": str(tmp_path)}
    monkeypatch.setattr(_checks, "machine_memory", lambda: 64 << 20)
    lines = [line for line in spec_warnings(parse_spec(spec)) if "memory" in line]
    assert len(lines) == 1 and "about 0.2 GiB for its 3,000 clients a round, more than" in lines[0], lines
    spec["training"]["clients_per_round"] = 100  # 100² pairs: nothing to say
    assert not [line for line in spec_warnings(parse_spec(spec)) if "memory" in line]


def test_a_large_table_is_projected_block_by_block_as_at_once(monkeypatch):
    x = _blobs(300, 4000)
    pca = tools.fit_pca(x, 5)
    whole = pca.transform(x)
    monkeypatch.setattr(tools, "_TRANSFORM_WHOLE_BYTES", 0)
    blocks = pca.transform(x)  # _row_slices: several blocks of 262 rows
    torch.testing.assert_close(blocks, whole, rtol=1e-5, atol=1e-5)


def test_rounds_for_scale_and_another_part_at_once_is_one_line(capsys):
    from cflpipe.cli import main

    assert main(["bench", "--part", "scale", "--part", "yardstick", "--rounds", "200"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --rounds: 200 would be the rounds of both --part scale and --part yardstick; allowed: --rounds with "
        "one of them (run scale alone for its own rounds)")


def test_the_scale_part_runs_only_the_populations_and_methods_it_is_given(monkeypatch, capsys):
    """#70 item 4: the full-against-sampled evaluation ran at 1,000 and 10,000 clients whatever
    --clients said (11 minutes for a user who asked for 100)."""
    from cflpipe import bench

    asked = []
    monkeypatch.setattr(bench_scale, "bench_methods_at_scale", lambda populations, methods, *a, **k: [])
    monkeypatch.setattr(bench, "bench_scale", lambda populations, repeats, device, methods: asked.append(
        (populations, methods)) or [])
    bench.run_bench(parts=["scale"], populations=[100], methods=None)
    assert asked == [] and "full against sampled evaluation: not run" in capsys.readouterr().out
    bench.run_bench(parts=["scale"], populations=[100, 1000], methods=["ifca", "cfl"])
    bench.run_bench(parts=["scale"], populations=None, methods=None)
    bench.run_bench(parts=["scale"], populations=[1000], methods=["cfl"])
    assert asked == [((1000,), ["ifca"]), ((1000, 10000), ["fedavg", "ifca"])]
    capsys.readouterr()
    # past 10,000 clients every client's evaluation is what the sample avoids (5.5 GB at 100,000)
    bench.run_bench(parts=["scale"], populations=[10000, 100000], methods=["fedavg"])
    assert asked[-1] == ((10000,), ["fedavg"])
    assert "not run at 100,000 clients" in capsys.readouterr().out
    before = len(asked)
    bench.run_bench(parts=["scale"], populations=[100000], methods=["ifca"])
    out = capsys.readouterr().out
    assert len(asked) == before and "not run at 100,000 clients" in out and "needs --clients" not in out
    bench.run_bench(parts=["scale"], populations=[100], methods=["ifca"])
    assert len(asked) == before and "needs --clients of 1,000 to 10,000" in capsys.readouterr().out
