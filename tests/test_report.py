"""Aggregation over seeds, paper tables and the HTML report, on a tiny set of real runs.

The runs (digits, 8 clients, 3 rounds, 2 seeds; fedavg, oracle and two FedProx that differ only
in mu, so the page has a clustered method, a missing cell and a sweep) are trained once per
session into a temp results folder and cached there (test_browser.py reuses them).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from cflpipe.errors import CflpipeError
from cflpipe.spec import parse_spec

from conftest import train_spec

SEEDS = [0, 1, 2]  # three: fewer are too few to test a best (tables.MIN_TEST_SEEDS)
SCENARIOS = ("swap", "skew")
METHODS = ("fedavg", "oracle", "prox-lo", "prox-hi")


def spec_data(root: Path, **changes) -> dict:
    data = {
        "description": "report test",
        "seeds": list(SEEDS),
        "results_dir": str(root / "results"),
        "data_dir": str(root / "datasets"),
        "training": {"model": "mlp", "rounds": 3, "clients_per_round": 4, "local_steps": 2, "batch_size": 16,
                     "lr": 0.1, "eval_every": 2, "checkpoint_every": 3, "device": "cpu"},
        "scenarios": {
            "swap": {"dataset": "digits", "clients": 8,
                     "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]},
            "skew": {"dataset": "digits", "clients": 8, "partition": [{"kind": "dirichlet", "alpha": 0.5}]},
        },
        "methods": {"fedavg": {}, "oracle": {"scenarios": ["swap"]},
                    "prox-lo": {"method": "fedprox", "mu": 0.01}, "prox-hi": {"method": "fedprox", "mu": 1.0}},
    }
    data.update(changes)
    return data


def built_runs(tmp_path_factory) -> dict:
    """Train the runs once per session (cached under the session's base temp folder)."""
    root = tmp_path_factory.getbasetemp() / "report-runs"
    spec = parse_spec(spec_data(root))
    if not (root / "trained").exists():
        train_spec(spec)
        (root / "trained").write_text("ok\n")
    return {"root": root, "spec": spec}


def built_report(tmp_path_factory) -> dict:
    from cflpipe.report.aggregate import aggregate
    from cflpipe.report.build import build_report

    runs = built_runs(tmp_path_factory)
    spec = runs["spec"]
    if not (runs["root"] / "reported").exists():
        aggregate(spec)
        build_report(spec)
        (runs["root"] / "reported").write_text("ok\n")
    results = Path(spec.results_dir)
    return {**runs, "aggregate": results / "aggregate", "report": results / "report",
            "index": results / "report" / "index.html"}


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict:
    return built_report(tmp_path_factory)


def summaries(spec) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for s, m, k in spec.matrix():
        out.setdefault((s, m), []).append(json.loads((spec.run_dir(s, m, k) / "summary.json").read_text()))
    return out


def mean_std(values) -> tuple[float, float]:
    """Mean and sample std (ddof = 1; NaN for a single value) of the values that are not None."""
    values = [v for v in values if v is not None]
    if not values:
        return math.nan, math.nan
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else math.nan


def close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


# --------------------------------------------------------------------------- aggregate


def test_matrix_is_what_the_tests_expect(built):
    spec = built["spec"]
    assert len(spec.matrix()) == (4 + 3) * len(SEEDS)  # oracle only on the grouped scenario


def test_summary_matches_hand_computed_means_and_stds(built):
    spec = built["spec"]
    summary = pd.read_parquet(built["aggregate"] / "summary.parquet")
    assert list(zip(summary["scenario"], summary["method"])) == [
        (s, m) for s in SCENARIOS for m in METHODS if not (s == "skew" and m == "oracle")]
    by_key = summaries(spec)
    timing = {(s, m): [json.loads((spec.run_dir(s, m, k) / "timing.json").read_text())["seconds_per_round"]
                       for k in SEEDS] for s, m, _ in spec.matrix()}
    for row in summary.itertuples(index=False):
        runs = by_key[(row.scenario, row.method)]
        assert row.seeds == len(runs) == len(SEEDS)
        for figure in ("acc_macro", "acc_micro", "acc_worst10", "global_acc_mean", "f1_macro", "f1_micro", "ari",
                       "nmi", "n_clusters", "intra_acc", "inter_acc"):
            mean, std = mean_std([r["final"].get(figure) for r in runs])
            assert close(getattr(row, f"{figure}_mean"), mean), (row.scenario, row.method, figure)
            assert close(getattr(row, f"{figure}_std"), std), (row.scenario, row.method, figure)
        for total in ("bytes_down_total", "bytes_up_total"):
            mean, std = mean_std([r[total] for r in runs])
            assert close(getattr(row, f"{total}_mean"), mean) and close(getattr(row, f"{total}_std"), std)
        mean, _ = mean_std([r["bytes_down_total"] + r["bytes_up_total"] for r in runs])
        assert close(row.bytes_total_mean, mean)
        mean, std = mean_std(timing[(row.scenario, row.method)])
        assert close(row.seconds_per_round_mean, mean) and close(row.seconds_per_round_std, std)
    # ARI/NMI are undefined without ground-truth groups, defined (oracle: perfect) with them.
    skew = summary[summary["scenario"] == "skew"]
    assert skew["ari_mean"].isna().all() and skew["nmi_mean"].isna().all()
    oracle = summary[(summary["scenario"] == "swap") & (summary["method"] == "oracle")].iloc[0]
    assert oracle.ari_mean == 1.0 and oracle.n_clusters_mean == 2.0


def test_summary_csv_is_the_parquet(built):
    parquet = pd.read_parquet(built["aggregate"] / "summary.parquet")
    csv = pd.read_csv(built["aggregate"] / "summary.csv", keep_default_na=False, na_values=[""])
    assert list(csv.columns) == list(parquet.columns)
    assert (csv["method"] == parquet["method"]).all()
    np.testing.assert_allclose(csv["acc_macro_mean"], parquet["acc_macro_mean"], rtol=1e-9)


def test_runs_table_has_one_row_per_run(built):
    spec = built["spec"]
    runs = pd.read_parquet(built["aggregate"] / "runs.parquet")
    assert list(zip(runs["scenario"], runs["method"], runs["seed"])) == spec.matrix()
    by_key = {(s, m, k): json.loads((spec.run_dir(s, m, k) / "summary.json").read_text())
              for s, m, k in spec.matrix()}
    for row in runs.itertuples(index=False):
        final = by_key[(row.scenario, row.method, row.seed)]["final"]
        assert close(row.acc_macro, final["acc_macro"])
        assert row.method_type == spec.method_type(row.method)
    assert set(runs.loc[runs["method"] == "prox-hi", "hyperparams"]) == {'{"mu":1.0}'}
    assert "seconds_per_round" not in runs.columns  # wall-clock figures stay out of runs.parquet


def test_curves_average_every_round(built):
    spec = built["spec"]
    curves = pd.read_parquet(built["aggregate"] / "curves.parquet")
    one = curves[(curves["scenario"] == "swap") & (curves["method"] == "fedavg")].set_index("round")
    assert list(one.index) == [1, 2, 3]
    assert list(one["eval"]) == [False, True, True]
    assert one.loc[1, "acc_macro_mean"] != one.loc[1, "acc_macro_mean"]  # NaN: not evaluated
    rounds = [pd.read_parquet(spec.run_dir("swap", "fedavg", k) / "rounds.parquet").set_index("round")
              for k in SEEDS]
    for r in (2, 3):
        mean, std = mean_std([float(x.loc[r, "acc_macro"]) for x in rounds])
        assert close(one.loc[r, "acc_macro_mean"], mean) and close(one.loc[r, "acc_macro_std"], std)
    for r in (1, 2, 3):  # every-round figures are there on non-evaluation rounds too
        assert close(one.loc[r, "bytes_down_mean"], float(np.mean([int(x.loc[r, "bytes_down"]) for x in rounds])))
        assert one.loc[r, "seeds"] == len(SEEDS)


def test_cumulative_bytes_are_summed_per_run_then_averaged(built):
    spec = built["spec"]
    curves = pd.read_parquet(built["aggregate"] / "curves.parquet")
    summary = pd.read_parquet(built["aggregate"] / "summary.parquet").set_index(["scenario", "method"])
    for (scenario, method), one in curves.groupby(["scenario", "method"]):
        one = one.set_index("round")
        sent = [pd.read_parquet(spec.run_dir(scenario, method, k) / "rounds.parquet").set_index("round")
                for k in SEEDS]
        per_seed = [np.cumsum([int(x.loc[r, "bytes_down"]) + int(x.loc[r, "bytes_up"]) for r in (1, 2, 3)])
                    for x in sent]
        for i, r in enumerate((1, 2, 3)):
            mean, std = mean_std([float(c[i]) for c in per_seed])
            assert close(one.loc[r, "bytes_cumulative_mean"], mean) and close(one.loc[r, "bytes_cumulative_std"], std)
        # After the last round: everything the run sent, as in summary.json's totals.
        assert math.isclose(one.loc[3, "bytes_cumulative_mean"], summary.loc[(scenario, method), "bytes_total_mean"])
        assert one.loc[3, "bytes_cumulative_mean"] > one.loc[1, "bytes_cumulative_mean"] > 0


def test_final_clients_are_the_last_evaluation_of_every_client(built):
    spec = built["spec"]
    clients = pd.read_parquet(built["aggregate"] / "final_clients.parquet")
    assert list(clients.columns) == ["scenario", "method", "seed", "client", "group", "model", "acc", "loss", "n"]
    assert len(clients) == len(spec.matrix()) * 8
    for (s, m, k), rows in clients.groupby(["scenario", "method", "seed"], sort=False):
        final = json.loads((spec.run_dir(s, m, k) / "summary.json").read_text())["final"]
        metrics = pd.read_parquet(spec.run_dir(s, m, k) / "metrics.parquet")
        want = metrics[(metrics["split"] == "test") & (metrics["round"] == final["round"])].sort_values("client")
        assert list(rows["client"]) == list(range(8)) and final["round"] == 3
        np.testing.assert_array_equal(rows["acc"].to_numpy(), want["acc"].to_numpy())
        np.testing.assert_array_equal(rows["n"].to_numpy(), want["n"].to_numpy())
        # The headline figure is the mean over the clients that have test samples.
        assert math.isclose(rows.loc[rows["n"] > 0, "acc"].mean(), final["acc_macro"], rel_tol=1e-12)
    swap = clients[(clients["scenario"] == "swap")]
    assert set(swap["group"]) == {0, 1} and set(clients.loc[clients["scenario"] == "skew", "group"]) == {-1}


def test_aggregate_is_deterministic(built):
    from cflpipe.report.aggregate import AGGREGATE_FILES, aggregate

    before = {name: (built["aggregate"] / name).read_bytes() for name in AGGREGATE_FILES}
    aggregate(built["spec"])
    after = {name: (built["aggregate"] / name).read_bytes() for name in AGGREGATE_FILES}
    assert before == after
    assert not [p for p in built["aggregate"].iterdir() if p.name.startswith(".")]  # no temp files left


def test_missing_run_is_one_clear_line(built, tmp_path, capsys):
    from cflpipe.cli import main
    from cflpipe.report.aggregate import aggregate

    root = built["root"]
    spec = parse_spec(spec_data(root, seeds=[0, 1, 7]))
    with pytest.raises(CflpipeError) as info:
        aggregate(spec)
    message = str(info.value)
    assert "\n" not in message
    assert str(spec.run_dir("swap", "fedavg", 7)) in message
    assert "cflpipe train --config FILE --scenario swap --method fedavg --seed 7" in message
    assert "snakemake" in message and "6 more runs" in message

    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(spec_data(root, seeds=[0, 1, 7])))
    assert main(["aggregate", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "seed7" in err[0]


def test_stale_run_is_reported(built):
    from cflpipe.report.aggregate import aggregate

    data = spec_data(built["root"])
    data["training"] = {**data["training"], "lr": 0.2}
    with pytest.raises(CflpipeError, match=r"config\.yaml differs from what the spec asks for now"):
        aggregate(parse_spec(data))


def test_report_needs_a_matching_aggregate(built, tmp_path):
    from cflpipe.report.build import build_report

    # Another results folder: nothing aggregated there.
    with pytest.raises(CflpipeError, match=r"run `cflpipe aggregate --config FILE`"):
        build_report(parse_spec(spec_data(tmp_path)))
    # The same folder but a different matrix.
    with pytest.raises(CflpipeError, match="different set of runs"):
        build_report(parse_spec(spec_data(built["root"], seeds=[0])))


# --------------------------------------------------------------------------- tables


def per_seed(built, figure: str, scenario: str, method: str) -> dict[int, float]:
    runs = pd.read_parquet(built["aggregate"] / "runs.parquet")
    rows = runs[(runs["scenario"] == scenario) & (runs["method"] == method)]
    return {int(k): float(v) for k, v in zip(rows["seed"], rows[figure]) if v == v}


def expected_marks(values: dict[str, dict[int, float]], direction: int = 1) -> dict[str, str]:
    """The tables' rule, computed here with scipy directly (references left out by the caller)."""
    from scipy.stats import ttest_rel

    means = {m: np.mean(list(v.values())) for m, v in values.items() if v}
    best = max(means, key=lambda m: direction * means[m])
    p = {}
    for m in means:
        if m != best:
            d = np.array([values[best][k] - values[m][k] for k in SEEDS])
            p[m] = (0.0 if d[0] else 1.0) if np.all(d == d[0]) else ttest_rel(
                [values[best][k] for k in SEEDS], [values[m][k] for k in SEEDS]).pvalue
    if all(v < 0.05 for v in p.values()):
        return {best: "best"}
    return {best: "tied", **{m: "tied" for m, v in p.items() if not v < 0.05}}


def test_paper_tables_mark_the_best_by_a_paired_test(built):
    tables = built["report"] / "tables"
    md = (tables / "summary.md").read_text()
    tex = (tables / "summary.tex").read_text()
    csv = pd.read_csv(tables / "summary.csv", keep_default_na=False, na_values=[""])
    assert list(csv.columns) == ["table", "figure", "scenario", "scenario_label", "method", "method_label",
                                 "reference", "n", "mean", "std", "text", "mark", "p_vs_best"]
    # Every headline figure has a table, in this order; ARI, intra and inter only where groups exist.
    assert list(dict.fromkeys(csv["table"])) == ["accuracy", "global_accuracy", "f1", "intra", "inter", "ari",
                                                 "bytes", "time"]
    assert set(csv.loc[csv["table"].isin(["ari", "intra", "inter"]), "scenario"]) == {"swap"}
    assert set(csv.loc[csv["table"] == "ari", "method"]) == {"oracle"}  # the only method that clusters
    for figure, table, scale, direction in (("acc_macro", "accuracy", 100, 1), ("global_acc_mean", "global_accuracy",
                                                                                    100, 1), ("bytes_total", "bytes", 1e-6, -1)):
        for scenario in SCENARIOS:
            rows = csv[(csv["table"] == table) & (csv["scenario"] == scenario)].set_index("method")
            values = {m: {k: v * scale for k, v in per_seed(built, figure, scenario, m).items()}
                      for m in METHODS if m != "oracle"}
            want = expected_marks(values, direction)
            for m in ("fedavg", "prox-lo", "prox-hi"):
                got = rows.loc[m, "mark"]
                assert (got if isinstance(got, str) else "") == want.get(m, ""), (table, scenario, m)
                mean, std = mean_std(list(values[m].values()))
                assert math.isclose(rows.loc[m, "mean"], mean, rel_tol=1e-9) and rows.loc[m, "n"] == len(SEEDS)
                assert math.isclose(rows.loc[m, "std"], std, rel_tol=1e-9, abs_tol=1e-12)
            if "oracle" in rows.index:
                assert not isinstance(rows.loc["oracle", "mark"], str) and rows.loc["oracle", "reference"]
    # Markdown: the caption states n and the std; bold / ≈ follow the CSV's marks; the test is named.
    accuracy_md = md.split("**Global accuracy")[0]
    # …and how the hyper-parameters were set (a spec that states no protocol: as it sets them, untuned)
    assert accuracy_md.startswith("**Personalized accuracy (%); mean ± sample std (n − 1) over n = 3 seeds; "
                                  "hyper-parameters as the spec sets them, untuned**")
    assert "two-sided paired t-test over seeds (p < 0.05)" in accuracy_md
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in accuracy_md.splitlines() if line.startswith("| ") and not line.startswith("| method")}
    assert list(rows) == ["fedavg", "oracle (reference)", "prox-lo", "prox-hi"]
    acc = csv[csv["table"] == "accuracy"]
    for r in acc.itertuples(index=False):
        name = "oracle (reference)" if r.method == "oracle" else r.method
        cell = rows[name][SCENARIOS.index(r.scenario)]
        assert r.text == f"{r.mean:.1f} ± {r.std:.1f}" or (r.method == "oracle" and r.scenario == "skew")
        mark = r.mark if isinstance(r.mark, str) else ""
        assert cell == {"best": f"**{r.text}**", "tied": f"{r.text} ≈", "": r.text}[mark]
    assert rows["oracle (reference)"][1] == "—"
    # LaTeX: booktabs, one table per block, escaped names, the reference dagger, the footnote.
    assert tex.count(r"\toprule") == tex.count(r"\bottomrule") == len(set(csv["table"]))
    accuracy_tex = tex.split(r"\end{table}")[0]
    assert (r"\caption{Personalized accuracy (\%); mean $\pm$ sample std (n $-$ 1) over n = 3 seeds; "
            r"hyper-parameters as the spec sets them, untuned}") in accuracy_tex
    assert r"\begin{tabular}{lcc}" in accuracy_tex and r"oracle$^\dagger$ & " in accuracy_tex
    assert r"paired t-test" in accuracy_tex and r"$^\dagger$ reference" in accuracy_tex
    tex_rows = {line.split(" & ")[0]: line.removesuffix(r" \\").split(" & ")[1:]
                for line in accuracy_tex.splitlines() if " & " in line and not line.startswith("Method")}
    assert tex_rows[r"oracle$^\dagger$"][1] == "--"
    for r in acc[acc["method"] != "oracle"].itertuples(index=False):
        text = r.text.replace("±", r"$\pm$")
        mark = r.mark if isinstance(r.mark, str) else ""
        assert tex_rows[r.method][SCENARIOS.index(r.scenario)] == {
            "best": rf"\textbf{{{text}}}", "tied": text + r"$^{\approx}$", "": text}[mark]


def test_paper_table_rules():
    from cflpipe.report.tables import ACCURACY, TableSpec, paper_table, to_latex, to_markdown

    def frame(values: dict[tuple[str, str], list[float]]) -> pd.DataFrame:
        return pd.DataFrame([{"scenario": s, "method": m, "seed": k, "acc_macro": v}
                             for (s, m), vs in values.items() for k, v in enumerate(vs)])

    values = {
        ("a", "x"): [0.90, 0.91, 0.92], ("a", "y"): [0.80, 0.82, 0.81], ("a", "ref"): [0.99, 0.99, 0.99],
        ("b", "x"): [0.50, 0.60, 0.55], ("b", "y"): [0.52, 0.58, 0.56],
        ("c", "x"): [0.70, 0.70, 0.70], ("c", "y"): [0.70, 0.70, 0.70],
        ("d", "x"): [0.71, 0.81, 0.61], ("d", "y"): [0.70, 0.80, 0.60],
    }
    table = paper_table(frame(values), ["a", "b", "c", "d", "e"], ["x", "y", "ref"], ACCURACY, {"ref": "oracle"},
                        method_labels={"x": "X | one"}, scenario_labels={"a": "A_1"})
    # Separated: bold; the reference is never marked, whatever its mean.
    assert [table.cell(m, "a").mark for m in ("x", "y", "ref")] == ["best", "", ""]
    assert table.cell("x", "a").text == "91.0 ± 1.0" and table.cell("x", "a").n == 3
    # Overlapping seeds: tied, with the p-value of the paired test.
    assert [table.cell(m, "b").mark for m in ("x", "y")] == ["tied", "tied"] and table.cell("x", "b").p > 0.05
    # Identical values: tied; the same difference on every seed: separated.
    assert [table.cell(m, "c").mark for m in ("x", "y")] == ["tied", "tied"]
    assert [table.cell(m, "d").mark for m in ("x", "y")] == ["best", ""] and table.cell("y", "d").p == 0.0
    # A scenario nobody ran: "—", nothing marked; only_defined is off, so the column stays.
    assert table.cell("x", "e").text == "—" and table.best("e") == [] and table.scenarios[-1] == "e"
    md = to_markdown(table)
    assert "| method | A_1 | b | c | d | e |" in md and "| X \\| one | **91.0 ± 1.0** |" in md
    assert "| y | 81.0 ± 1.0 | 55.3 ± 3.1 ≈ |" in md and "| ref (reference) | 99.0 ± 0.0 | — |" in md
    tex = to_latex(table)
    assert r"X \textbar{} one & \textbf{91.0 $\pm$ 1.0} & 55.0 $\pm$ 5.0$^{\approx}$" in tex and "A\\_1" in tex
    # One seed: no std (not NaN, not 0), nothing marked, the caption says so.
    one = paper_table(frame({("a", "x"): [0.5], ("a", "y"): [0.4]}), ["a"], ["x", "y"], ACCURACY)
    assert one.cell("x", "a").text == "50.0" and not one.cell("x", "a").bold and one.seeds == 1
    assert one.caption.endswith("mean (one seed: no std) over n = 1 seed") and "no test is possible" in one.notes[0]
    # Seeds differ between cells: each cell states its n. Lower is better where asked; no best for 0.
    mixed = paper_table(frame({("a", "x"): [0.5, 0.6], ("a", "y"): [0.4, 0.3, 0.35]}), ["a"], ["x", "y"], ACCURACY)
    assert mixed.seeds is None and mixed.cell("y", "a").text.endswith("(n=3)")
    lower = TableSpec("t", "t", "acc_macro", 1.0, 2, direction=-1)
    assert paper_table(frame(values), ["a"], ["x", "y"], lower).cell("y", "a").bold
    none = TableSpec("t", "t", "acc_macro", 1.0, 2, direction=0)
    assert not [c for c in paper_table(frame(values), ["a"], ["x", "y"], none).cells.values() if c.mark]


# --------------------------------------------------------------------------- html


SECTION_IDS = ("glance", "setup", "accuracy", "comparison", "ranking", "clients", "clustering", "robustness", "communication",
               "intra-inter", "sweeps", "overview")


def test_report_is_one_self_contained_file(built):
    index = built["index"]
    assert sorted(p.name for p in built["report"].iterdir()) == ["glance.txt", "index.html", "tables"]
    html = index.read_text()
    assert html.count("* plotly.js v") == 1  # the bundle's licence header: inlined exactly once
    assert not re.search(r"<script[^>]*\bsrc\s*=", html, re.I)
    assert not re.search(r"<link[^>]*\bhref\s*=\s*[\"']?(https?:)?//", html, re.I)
    assert not re.search(r"<(img|iframe|source|video|audio)[^>]*\bsrc\s*=\s*[\"']?(https?:)?//", html, re.I)
    assert not re.search(r"@import|url\(\s*[\"']?(https?:)?//", html.split("<script>")[0], re.I)
    assert re.findall(r'<section id="([^"]+)">', html) == list(SECTION_IDS)  # results first, partitions last
    figures = re.findall(r'<div class="cfl-fig" id="([^"]+)"', html)
    assert len(figures) == len(set(figures)) > 10
    for fid in figures:  # every figure has valid JSON with data and layout
        match = re.search(rf'<script type="application/json" id="{re.escape(fid)}-data">(.*?)</script>', html, re.S)
        spec = json.loads(match.group(1))
        assert "data" in spec and "layout" in spec


def test_report_content(built):
    html = built["index"].read_text()
    body = html.split("</head>", 1)[1]
    # Overview facts, the assignment heatmap of the clustered method only, the sweep over mu.
    assert "label_swap(groups=2)" in body and "dirichlet(alpha=0.5" in body
    assert "swap · oracle (seed 0): client clusters per round" in body
    assert "skew · oracle" not in body and "fedavg (seed" not in body
    assert "no ground-truth groups: ARI and NMI are undefined" in body
    assert "no ground-truth groups: intra/inter-cluster accuracy is undefined" in body
    assert "swap: fedprox vs \\u03bc" in body or "swap: fedprox vs μ" in body
    # The HTML paper tables mark the cells the CSV marks (bold best, ≈ tied) and state n.
    csv = pd.read_csv(built["report"] / "tables" / "summary.csv", keep_default_na=False)
    for key, rows in csv.groupby("table", sort=False):
        html_table = re.search(rf'<table class="paper" id="table-{key}">.*?</table>', body, re.S).group(0)
        assert "over n = 3 seeds" in html_table
        assert html_table.count('class="best"') == (rows["mark"] == "best").sum(), key
        assert html_table.count('class="tied"') == (rows["mark"] == "tied").sum(), key
    assert (csv["mark"] != "").any() and "paired t-test" in body


def test_report_is_deterministic(built):
    from cflpipe.report.build import build_report

    before = built["index"].read_bytes()
    tables = {p.name: p.read_bytes() for p in (built["report"] / "tables").iterdir()}
    build_report(built["spec"])
    assert built["index"].read_bytes() == before
    assert {p.name: p.read_bytes() for p in (built["report"] / "tables").iterdir()} == tables


def test_find_sweeps_prefers_beta():
    from cflpipe.report.build import find_sweeps

    methods = {"b1": {"method": "fedprox", "mu": 0.1}, "b2": {"method": "fedprox", "mu": 0.2},
               "c1": {"method": "soft", "beta": 0.5, "k": 2}, "c2": {"method": "soft", "beta": 1.0, "k": 2},
               "c3": {"method": "soft", "beta": 0.5, "k": 3}}
    spec = parse_spec(spec_data(Path("/nonexistent"), methods=methods), check_methods=False)
    summary = pd.DataFrame({
        "scenario": ["swap"] * 5, "method": ["b1", "b2", "c1", "c2", "c3"],
        "method_type": ["fedprox", "fedprox", "soft", "soft", "soft"],
        "hyperparams": ['{"mu":0.1}', '{"mu":0.2}', '{"beta":0.5,"k":2}', '{"beta":1.0,"k":2}', '{"beta":0.5,"k":3}'],
    })
    sweeps = find_sweeps(summary, spec)
    assert [(s.method_type, s.param, s.values, s.methods) for s in sweeps] == [
        ("soft", "beta", (0.5, 1.0), ("c1", "c2")),   # c3 differs in k as well: not in the β sweep
        ("fedprox", "mu", (0.1, 0.2), ("b1", "b2")),
        ("soft", "k", (2.0, 3.0), ("c1", "c3")),
    ]
    assert sweeps[0].symbol == "β"


# --------------------------------------------------------------------------- styles


def test_every_method_entry_has_its_own_style_grouped_by_family():
    from cflpipe.registry import all_methods
    from cflpipe.report.styles import FAMILIES, assign_styles, capacity, method_family

    families = {
        "reference": ["oracle", "oracle_awcfl", "oracle_mcfl"],
        "baseline": ["fedavg", "fedprox", "local"],
        "personalized": ["fedper", "ditto", "perfedavg", "cgpfl"],
        "clustered": ["ifca", "cfl", "flhc", "fedgroup", "kmeans_cfl"],
        "seed": ["fedac", "fcca", "fcca_per", "fcca_prox", "fcca_per_prox", "fedtsdp", "fesem", "awcfl", "mcfl",
                 "cfl_awcfl", "ifca_mcfl", "fesem_awcfl"],
    }
    for family, types in families.items():
        assert {t: method_family(t) for t in types} == {t: family for t in types}
    assert {method_family(t) for t in all_methods()} <= {f.key for f in FAMILIES}  # every registered type has a family
    # Every registered type, then many entries of one type (a sweep): 3 × 34 + 40 entries.
    entries = [(f"{t}-{i}", t) for i in range(3) for t in all_methods()]
    entries += [(f"awcfl-beta{i}", "awcfl") for i in range(40)]
    styles = assign_styles(entries)
    by_family: dict[str, list] = {}
    for name, style in styles.items():
        by_family.setdefault(style.family, []).append(style)
    for family, members in by_family.items():
        assert len(members) <= capacity(family), family
        keys = [s.key for s in members]
        assert len(keys) == len(set(keys)), f"{family}: two entries share colour, dash and marker"
        lines = [(s.color, s.dash) for s in members[:36]]
        assert len(lines) == len(set(lines)), f"{family}: two of the first 36 share colour and dash"
        assert all(a.marker != b.marker for a, b in zip(members, members[1:]))
    assert len({s.key for s in styles.values()}) == len(styles)  # unique across families too
    colours = [c for f in FAMILIES for c in f.colors]
    assert len(colours) == len(set(colours)), "two families share a colour"
    # Stable: a method's style depends on its family's entries before it, not on the others.
    fewer = assign_styles([(n, t) for n, t in entries if method_family(t) != "baseline"])
    assert all(fewer[n] == styles[n] for n in fewer)
    assert assign_styles(list(entries)) == styles


# --------------------------------------------------------------------------- setup, provenance, labels


def test_runs_record_their_provenance(built):
    import datetime

    import torch

    from cflpipe import __version__
    from cflpipe.spec import spec_sha256

    spec = built["spec"]
    runs = pd.read_parquet(built["aggregate"] / "runs.parquet")
    timing = pd.read_parquet(built["aggregate"] / "timing.parquet")
    for s, m, k in spec.matrix():
        d = spec.run_dir(s, m, k)
        provenance = json.loads((d / "summary.json").read_text())["provenance"]
        assert provenance["cflpipe"] == __version__ and provenance["torch"] == torch.__version__
        assert provenance["device_requested"] == "cpu" and "spec_sha256" not in provenance
        assert re.fullmatch(r"[0-9a-f]{64}", provenance["config_sha256"])
        # Volatile facts only in timing.json (not compared byte for byte): when, which commit, and
        # the whole spec's hash (it changes with entries unrelated to this run).
        volatile = json.loads((d / "timing.json").read_text())
        assert volatile["spec_sha256"] == spec_sha256(spec)
        finished = datetime.datetime.fromisoformat(volatile["finished_utc"])
        assert finished.tzinfo is not None and abs(datetime.datetime.now(datetime.timezone.utc) - finished).days < 1
        assert "finished_utc" not in json.dumps(provenance)
        assert volatile["git_commit"] is None and volatile["git_dirty"] is None  # a temp folder: no checkout
    assert set(runs["torch_version"]) == {torch.__version__} and set(timing["spec_sha256"]) == {spec_sha256(spec)}
    assert set(timing["git_commit"]) == {""} and timing["finished_utc"].str.endswith("+00:00").all()
    # One config hash per scenario × method: the seed is part of the run, the thread count is not.
    assert runs.groupby(["scenario", "method"])["config_sha256"].nunique().eq(len(SEEDS)).all()


def test_git_commit_of_the_results_checkout(tmp_path):
    import shutil
    import subprocess

    from cflpipe.fl.runs import volatile_provenance

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(tmp_path), "PATH": __import__("os").environ["PATH"]}
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, env=env)
    commit = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True,
                            env=env).stdout.strip()
    run_dir = tmp_path / "results" / "runs" / "s" / "m" / "seed0"
    run_dir.mkdir(parents=True)
    got = volatile_provenance(run_dir)
    assert got["git_commit"] == commit and got["git_dirty"] is False
    (tmp_path / "tracked.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.txt"], check=True, env=env)
    assert volatile_provenance(run_dir)["git_dirty"] is True  # staged, not committed


def test_spec_hash_and_run_configs_ignore_labels_and_paths(tmp_path):
    from cflpipe.fl.data import _fingerprint
    from cflpipe.fl.runs import resolved_config
    from cflpipe.spec import spec_sha256

    plain = parse_spec(spec_data(tmp_path))
    data = spec_data(tmp_path / "elsewhere", description="other")
    data["scenarios"]["swap"]["label"] = "Label swap (2 groups)"
    data["methods"]["prox-lo"]["label"] = "FedProx μ=0.01"
    labelled = parse_spec(data)
    assert labelled.method_label("prox-lo") == "FedProx μ=0.01" and labelled.method_label("fedavg") == "fedavg"
    assert labelled.scenario_label("swap") == "Label swap (2 groups)" and labelled.methods["prox-lo"].hyperparams == \
        {"mu": 0.01}
    assert spec_sha256(labelled) == spec_sha256(plain)
    assert _fingerprint(labelled, "swap") == _fingerprint(plain, "swap")
    for s, m, k in plain.matrix():  # a label re-trains nothing: every run's config is the same
        same = {**resolved_config(plain, s, m, k), "data_dir": None}
        assert {**resolved_config(labelled, s, m, k), "data_dir": None} == same
    changed = spec_data(tmp_path)
    changed["training"] = {**changed["training"], "lr": 0.2}
    assert spec_sha256(parse_spec(changed)) != spec_sha256(plain)


@pytest.mark.parametrize("where, label, message", [
    ("methods.prox-hi", "prox-lo", "methods.prox-lo.label: 'prox-hi' is the name of methods.prox-hi"),
    ("methods.prox-hi", "", "methods.prox-hi.label: must be one line of text that is not blank, got ''"),
    ("methods.prox-hi", "a\nb", "methods.prox-hi.label: must be one line of text that is not blank"),
    ("methods.prox-hi", "a\u2028b", "methods.prox-hi.label: must be one line of text that is not blank"),
    ("methods.prox-hi", " prox", "methods.prox-hi.label: must be one line of text that is not blank"),
    ("methods.prox-hi", 3, "methods.prox-hi.label: must be a string, got 3"),
    ("scenarios.skew", "x" * 81, "scenarios.skew.label: must have at most 80 characters"),
])
def test_bad_label_is_one_clear_line(tmp_path, where, label, message):
    from cflpipe.errors import SpecError

    data = spec_data(tmp_path)
    key, name = where.split(".")
    if (key, name) == ("methods", "prox-hi") and label == "prox-lo":  # a label that is another entry's name
        data["methods"]["prox-lo"]["label"] = "prox-hi"
    else:
        data[key][name]["label"] = label
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    assert "\n" not in str(info.value) and str(info.value).startswith(message)


def test_report_states_the_setup_and_uses_labels(built):
    import torch

    from cflpipe.report.aggregate import read_aggregate
    from cflpipe.report.build import render_report
    from cflpipe.spec import spec_sha256

    html = built["index"].read_text().split("</head>", 1)[1]
    setup = re.search(r'<section id="setup">.*?</section>', html, re.S).group(0)
    rows = {m.group(1): re.findall(r"<td>(.*?)</td>", m.group(2))
            for m in re.finditer(r'<tr><th scope="row">([^<]+)</th>(.*?)</tr>', setup.split('id="setup-methods"')[0])}
    assert rows["partition"] == ["iid, label_swap(groups=2)", "dirichlet(alpha=0.5, min_size=10)"]
    assert rows["model"] == ["mlp", "mlp"] and rows["local work per round"] == ["2 steps", "2 steps"]
    assert rows["lr"] == ["0.1", "0.1"] and rows["batch size"] == ["16", "16"] and rows["momentum"] == ["0", "0"]
    assert rows["clients per round"] == ["4", "4"] and rows["rounds"] == ["3", "3"]
    assert rows["partition seed"] == ["0", "0"] and rows["seeds"] == ["0, 1, 2", "0, 1, 2"]
    methods = setup.split('id="setup-methods"')[1]
    assert re.search(r'<th scope="row">prox-hi</th><td class="left">fedprox</td><td class="left">baselines</td>'
                     r'<td class="left">all</td><td class="left">—</td><td class="left">mu=1.0</td>', methods)
    assert re.search(r'<th scope="row">oracle</th>.*?<td class="left">swap</td>', methods)
    facts = dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", setup))
    assert facts["torch"] == torch.__version__ and facts["device requested"] == "cpu"
    assert facts["device used"] == "cpu" and facts["spec hash"].startswith(spec_sha256(built["spec"]))
    assert facts["git commit"] == "unknown (results not in a git checkout)"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC( to \d{4}-\d\d-\d\d \d\d:\d\d UTC)?", facts["runs finished"])
    assert 'id="fig-001-method-styles"' in setup
    # Labels: figures, tables and headings use them; the runs (and their configs) are the same.
    data = spec_data(built["root"])
    data["scenarios"]["swap"]["label"] = "Label swap <2>"
    data["methods"]["prox-lo"]["label"] = "FedProx (μ = 0.01)"
    spec = parse_spec(data)
    page, paper, *_ = render_report(spec, read_aggregate(spec))
    assert "FedProx (μ = 0.01)" in paper[0].method_label("prox-lo") and paper[0].scenario_label("swap") == \
        "Label swap <2>"
    assert "Label swap &lt;2&gt;" in page and "Label swap <2>" not in page  # escaped in HTML
    figures = [json.loads(m) for m in re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', page,
                                                 re.S)]
    names = {t.get("name") for f in figures for t in f["data"]}
    assert "FedProx (μ = 0.01)" in names and "prox-lo" not in names
    bars = {x for f in figures for t in f["data"] if t.get("type") == "bar" for x in t.get("x", [])}
    assert "FedProx (μ = 0.01)" in bars and "prox-lo" not in bars
    titles = " ".join(str(f["layout"].get("title", {}).get("text", "")).replace("<br>", " ") for f in figures)
    assert "Label swap <2>: personalized accuracy" in titles and "swap: " not in titles.replace("Label swap", "")
    for section in ("overview", "accuracy", "clients", "clustering", "communication", "intra-inter"):
        assert f'<h3 id="{section}-swap">Label swap &lt;2&gt;</h3>' in page
    assert "<th>Label swap &lt;2&gt;</th>" in page.split('id="ranking-table"')[1]


# --------------------------------------------------------------------------- ranks (Demšar 2006)


def test_nemenyi_critical_values_and_cd_match_demsar():
    from cflpipe.report.ranks import critical_difference, nemenyi_groups, q_alpha

    # Demšar (2006), Table 5: critical values of the two-tailed Nemenyi test, k = 2 … 10.
    table_05 = (1.960, 2.343, 2.569, 2.728, 2.850, 2.949, 3.031, 3.102, 3.164)
    table_10 = (1.645, 2.052, 2.291, 2.459, 2.589, 2.693, 2.780, 2.855, 2.920)
    for k, (q05, q10) in enumerate(zip(table_05, table_10), start=2):
        # (his table truncates some to 3 decimals: 2.3437 is printed 2.343)
        assert abs(q_alpha(k, 0.05) - q05) < 1e-3 and abs(q_alpha(k, 0.10) - q10) < 1e-3, k
    # His example: 4 classifiers on 14 data sets, CD = 2.569 · √(4·5 / (6·14)) = 1.25 (α = 0.05)
    # and 1.12 at α = 0.10, where C4.5+m+cf (1.964) is better than C4.5 (3.143): 1.179 > 1.12.
    assert math.isclose(critical_difference(4, 14), 2.569 * math.sqrt(20 / 84), abs_tol=5e-4)
    assert round(critical_difference(4, 14), 2) == 1.25 and round(critical_difference(4, 14, 0.10), 2) == 1.12
    average = pd.Series({"C4.5": 3.143, "C4.5+m": 2.000, "C4.5+cf": 2.893, "C4.5+m+cf": 1.964})
    assert nemenyi_groups(average, critical_difference(4, 14)) == [["C4.5+m+cf", "C4.5+m", "C4.5+cf", "C4.5"]]
    assert nemenyi_groups(average, critical_difference(4, 14, 0.10)) == [["C4.5+m+cf", "C4.5+m", "C4.5+cf"],
                                                                         ["C4.5+cf", "C4.5"]]
    # A difference of exactly CD is significant ("at least CD"); groups inside others are dropped.
    assert nemenyi_groups(pd.Series({"a": 1.0, "b": 2.0, "c": 3.0}), 2.0) == [["a", "b"], ["b", "c"]]
    assert nemenyi_groups(pd.Series({"a": 1.0, "b": 1.5, "c": 1.6, "d": 5.0}), 1.0) == [["a", "b", "c"]]


def test_rank_methods_hand_computed():
    from cflpipe.report.ranks import rank_methods

    # Ties share the average rank: in `a`, Y and Z tie for ranks 2 and 3.
    scores = pd.DataFrame({"X": [0.9, 0.7, 0.9], "Y": [0.8, 0.9, 0.85], "Z": [0.8, 0.6, 0.8], "W": [0.5, 0.5, 0.7]},
                          index=["a", "b", "c"])
    r = rank_methods(scores)
    assert r.ranks.loc["a"].tolist() == [1.0, 2.5, 2.5, 4.0] and r.ranks.loc["b"].tolist() == [2.0, 1.0, 3.0, 4.0]
    assert np.allclose(r.average.to_numpy(), [4 / 3, 5.5 / 3, 8.5 / 3, 4.0])
    # χ² = 12 ΣR²/(N k (k+1)) − 3N(k+1) = 12·262.5/60 − 45 = 7.5, over the tie correction
    # 1 − Σ(t³ − t)/(N(k³ − k)) = 1 − 6/180: 225/29; p from χ²(3): erfc(√(x/2)) + √(2x/π)·e^(−x/2).
    x = 225 / 29
    assert math.isclose(r.statistic, x, rel_tol=1e-12)
    assert math.isclose(r.p_value, math.erfc(math.sqrt(x / 2)) + math.sqrt(2 * x / math.pi) * math.exp(-x / 2),
                        rel_tol=1e-9)
    assert not r.significant and r.cd is None and r.groups == []  # p = 0.051: no post-hoc test
    assert any("does not reject" in n for n in r.notes) and any("rough" in n for n in r.notes)
    # Lower is better: the ranks turn around.
    assert rank_methods(scores, higher_is_better=False).average["W"] == 1.0
    # The same order in 3 scenarios: χ² = 12·3/(3·4)·((1−2)² + (3−2)²) = 6, p = e^−3 < 0.05; then
    # CD = q(3)·√(3·4/(6·3)) and only the best and the worst differ (2 ≥ CD > 1).
    perfect = pd.DataFrame({"A": [0.9] * 3, "B": [0.8] * 3, "C": [0.7] * 3}, index=["a", "b", "c"])
    r = rank_methods(perfect)
    assert r.statistic == pytest.approx(6.0) and r.p_value == pytest.approx(math.exp(-3)) and r.significant
    assert r.cd == pytest.approx(2.343701 * math.sqrt(12 / 18), rel=1e-6)
    assert r.groups == [["A", "B"], ["B", "C"]]


def test_rank_methods_says_what_it_cannot_do():
    from cflpipe.report.ranks import rank_methods

    scores = pd.DataFrame({"A": [0.9, 0.8], "B": [0.8, math.nan], "C": [0.7, 0.6]}, index=["a", "b"])
    # B misses a scenario and C was excluded by the caller: one method left, nothing to rank.
    assert rank_methods(scores, excluded={"C": "reference"}) is None
    r = rank_methods(scores.assign(D=[0.5, 0.9]), excluded={"C": "reference"})
    assert r.methods == ["A", "D"] and r.excluded == {"C": "reference", "B": "no result on b"}
    assert not r.tested and r.cd is None and "at least 3 methods and 2 scenarios" in r.notes[0]
    one = rank_methods(pd.DataFrame({"A": [0.9], "B": [0.8], "C": [0.7]}, index=["a"]))
    assert one.average.tolist() == [1.0, 2.0, 3.0] and not one.tested and "(here 3 methods on 1 scenario)" in one.notes[0]
    tied = rank_methods(pd.DataFrame({"A": [0.5, 0.6], "B": [0.5, 0.6], "C": [0.5, 0.6]}, index=["a", "b"]))
    assert tied.average.tolist() == [2.0, 2.0, 2.0] and not tied.tested and "ties all methods" in tied.notes[0]


# --------------------------------------------------------------------------- new views


def page_figures(html: str) -> dict[str, dict]:
    """{figure id: its plotly JSON} of a report page."""
    return {fid: json.loads(text) for fid, text in
            re.findall(r'<script type="application/json" id="([^"]+)-data">(.*?)</script>', html, re.S)}


def figure_titled(figures: dict[str, dict], title: str) -> dict:
    # long titles are wrapped with <br> (plotting.wrap_title)
    found = [f for f in figures.values() if f["layout"].get("title", {}).get("text", "").replace("<br>", " ") == title]
    assert len(found) == 1, (title, [f["layout"].get("title", {}).get("text") for f in figures.values()])
    return found[0]


def test_byte_units():
    from cflpipe.report.build import byte_unit

    assert byte_unit(0) == (1.0, "B") and byte_unit(999) == (1.0, "B") and byte_unit(math.nan) == (1.0, "B")
    assert byte_unit(1000) == (1e-3, "kB") and byte_unit(2.2e6) == (1e-6, "MB") and byte_unit(3e9) == (1e-9, "GB")


def test_ranking_section_ranks_the_summary_means(built):
    from scipy.stats import friedmanchisquare

    html = built["index"].read_text().split("</head>", 1)[1]
    section = re.search(r'<section id="ranking">.*?</section>', html, re.S).group(0)
    summary = pd.read_parquet(built["aggregate"] / "summary.parquet").set_index(["scenario", "method"])
    ranked = ["fedavg", "prox-lo", "prox-hi"]  # the oracle is a reference (and misses skew)
    means = {s: {m: summary.loc[(s, m), "acc_macro_mean"] for m in ranked} for s in SCENARIOS}
    ranks = {s: {m: 1 + sum(v > means[s][m] for v in means[s].values())
                 + (sum(v == means[s][m] for v in means[s].values()) - 1) / 2 for m in ranked} for s in SCENARIOS}
    average = {m: np.mean([ranks[s][m] for s in SCENARIOS]) for m in ranked}
    rows = re.findall(r'<tr><th scope="row">([^<]+)</th><td><strong>([^<]+)</strong></td>(.*?)</tr>', section)
    assert [r[0] for r in rows] == sorted(ranked, key=lambda m: average[m])  # stable: spec order for ties
    for method, avg, cells in rows:
        assert avg == f"{average[method]:.2f}"
        got = re.findall(r'<td>([0-9.]+) <span class="muted">\(([0-9.]+)\)</span></td>', cells)
        assert got == [(f"{ranks[s][method]:g}", f"{means[s][method] * 100:.1f}") for s in SCENARIOS]
    p = friedmanchisquare(*([means[s][m] for s in SCENARIOS] for m in ranked)).pvalue
    assert "χ²(2) = " in section and f"p = {p:.3g}" in section
    # Three methods on two scenarios can never reach p < 0.05 (χ² ≤ N(k − 1) = 4): no diagram.
    assert p >= 0.135 and "no critical-difference diagram is drawn" in section and "cfl-fig" not in section
    assert "Not ranked: reference (told the true groups): oracle." in section


def test_client_accuracy_boxes_are_the_clients_seed_means(built):
    html = built["index"].read_text()
    figures = page_figures(html)
    clients = pd.read_parquet(built["aggregate"] / "final_clients.parquet")
    summary = pd.read_parquet(built["aggregate"] / "summary.parquet").set_index(["scenario", "method"])
    from cflpipe.report.styles import assign_styles

    spec = built["spec"]
    styles = assign_styles([(m, spec.method_type(m)) for m in spec.methods])
    for scenario in SCENARIOS:
        fig = figure_titled(figures, f"{scenario}: final accuracy of each client (its mean over seeds)")
        boxes = {t["name"]: t for t in fig["data"]}
        assert all(t["type"] == "box" and t["orientation"] == "h" and t["boxmean"] is True for t in boxes.values())
        want = [m for m in ("oracle", "fedavg", "prox-lo", "prox-hi") if (scenario, m) in summary.index]
        assert list(boxes) == want  # family order: the reference first
        for m, t in boxes.items():
            rows = clients[(clients["scenario"] == scenario) & (clients["method"] == m) & (clients["n"] > 0)]
            per_client = rows.groupby("client")["acc"].mean() * 100
            np.testing.assert_allclose(t["x"], per_client.to_numpy(), rtol=1e-12)
            assert t["text"] == [f"client {c}" for c in per_client.index]
            # The dashed mean line is the table's acc macro.
            assert math.isclose(np.mean(t["x"]), summary.loc[(scenario, m), "acc_macro_mean"] * 100, rel_tol=1e-9)
            assert t["line"]["color"] == styles[m].color and t["marker"]["symbol"] == styles[m].marker


def test_training_loss_and_accuracy_vs_bytes(built):
    html = built["index"].read_text()
    figures = page_figures(html)
    curves = pd.read_parquet(built["aggregate"] / "curves.parquet")
    for scenario in SCENARIOS:
        rows = curves[curves["scenario"] == scenario]
        loss = [f for f in figures.values() if f["layout"]["title"]["text"].replace("<br>", " ").startswith(f"{scenario}: training loss")]
        assert len(loss) == 1
        traces = {t["name"]: t for t in loss[0]["data"] if t.get("mode") == "lines+markers"}
        values = rows["train_loss_mean"].to_numpy(dtype=float)
        log = values.min() > 0 and values.max() / values.min() >= 10
        assert (loss[0]["layout"]["yaxis"].get("type") == "log") == log
        for name, t in traces.items():
            one = rows[rows["method"] == name]
            assert t["x"] == one["round"].tolist() == [1, 2, 3]  # every round, not only evaluated ones
            np.testing.assert_allclose(t["y"], one["train_loss_mean"].to_numpy(), rtol=1e-12)

        fig = figure_titled(figures, f"{scenario}: personalized accuracy vs bytes sent so far (mean over seeds)")
        largest = rows.loc[rows["eval"], "bytes_cumulative_mean"].max()
        assert 1e6 <= largest < 1e9, largest  # the tiny runs send megabytes: the axis says MB
        assert fig["layout"]["xaxis"]["title"]["text"] == "MB sent up to the round (down + up)"
        assert fig["layout"]["xaxis"]["rangemode"] == "tozero"
        for t in fig["data"]:
            one = rows[(rows["method"] == t["name"]) & rows["eval"]]
            assert t["customdata"] == [2, 3]
            np.testing.assert_allclose(t["x"], one["bytes_cumulative_mean"].to_numpy() / 1e6, rtol=1e-12)
            np.testing.assert_allclose(t["y"], one["acc_macro_mean"].to_numpy() * 100, rtol=1e-12)
        # Per-round bytes: from 0, so equal models sent by every method are not blown up to full scale.
        largest = max(rows["bytes_down_mean"].max(), rows["bytes_up_mean"].max())
        scale, unit = (1e-6, "MB") if largest >= 1e6 else (1e-3, "kB")
        assert largest >= 1e3
        for direction in ("down", "up"):
            per_round = [f for f in figures.values()
                         if f["layout"]["title"]["text"].replace("<br>", " ").startswith(f"{scenario}: bytes {direction} per round")][0]
            assert per_round["layout"]["yaxis"]["rangemode"] == "tozero"
            assert per_round["layout"]["yaxis"]["title"]["text"] == unit
            for t in per_round["data"]:
                one = rows[rows["method"] == t["name"]]
                np.testing.assert_allclose(t["y"], one[f"bytes_{direction}_mean"].to_numpy() * scale, rtol=1e-12)


def test_label_histograms_are_collapsed_below_the_results(built):
    html = built["index"].read_text().split("</head>", 1)[1]
    overview = re.search(r'<section id="overview">.*?</section>', html, re.S)
    assert overview.start() > html.index('<section id="sweeps">')
    details = re.findall(r'<details class="labels" id="labels-([^"]+)">(.*?)</details>', overview.group(0), re.S)
    assert [d[0] for d in details] == list(SCENARIOS)
    for _, inner in details:
        assert "label share of each client" in inner and 'class="cfl-fig"' in inner
    assert "<details open" not in html  # collapsed until the reader opens one
    assert html.count('class="cfl-fig"') - sum(d[1].count('class="cfl-fig"') for d in details) > 10


def test_ranking_leaves_out_a_method_without_a_result(built):
    from cflpipe.report.aggregate import read_aggregate
    from cflpipe.report.build import render_report

    spec = built["spec"]
    tables = read_aggregate(spec)
    summary = tables["summary"]
    # As if every seed of prox-hi diverged on skew: its mean is undefined there.
    summary.loc[(summary["scenario"] == "skew") & (summary["method"] == "prox-hi"), "acc_macro_mean"] = math.nan
    html, *_ = render_report(spec, tables)
    section = re.search(r'<section id="ranking">.*?</section>', html, re.S).group(0)
    assert "Not ranked: reference (told the true groups): oracle; no acc_macro on skew: prox-hi." in section
    assert re.findall(r'<tr><th scope="row">([^<]+)</th>', section.split('id="ranking-table"')[1]) \
        in (["fedavg", "prox-lo"], ["prox-lo", "fedavg"])
    assert "at least 3 methods and 2 scenarios (here 2 methods on 2 scenarios)" in section


def test_the_report_shows_one_spelling_of_the_spec_path(tmp_path, monkeypatch):
    from cflpipe.report.build import shown_spec_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config").mkdir()
    spellings = ["config/x.yaml", "./config/x.yaml", str(tmp_path / "config" / "x.yaml"), "config/../config/x.yaml"]
    assert {shown_spec_path(p) for p in spellings} == {"config/x.yaml"}
    assert shown_spec_path("/elsewhere/y.yaml") == "/elsewhere/y.yaml" and shown_spec_path(None) == ""


def test_bands_are_clipped_to_their_figures_range():
    """#35 item 4: a cluster count's ± std band no longer dips below 0, accuracy's not above 1."""
    from cflpipe.report.figures import figure_range

    assert figure_range("n_clusters") == (0.0, float("inf")) and figure_range("acc_macro") == (0.0, 1.0)
    assert figure_range("ari") == (-1.0, 1.0) and figure_range("flow_nll") == (float("-inf"), float("inf"))


def test_long_titles_wrap_before_the_upright_toolbar():
    """#35 item 4: plotly's toolbar covered long titles; it stands upright in a right margin of
    its own and a long title wraps into lines that fit the narrowest plot area."""
    import json

    import plotly.graph_objects as go

    from cflpipe.report.plotting import LEGEND_WIDTH_PX, MODEBAR_PX, TITLE_FONT_PX, Figures, wrap_title

    title = "digits, 4 permuted groups: personalized accuracy (mean over clients) per round"
    lines = wrap_title(title)
    assert " ".join(lines) == title and len(lines) == 2
    assert all(len(line) * TITLE_FONT_PX <= LEGEND_WIDTH_PX for line in lines)
    figure = Figures().add(go.Figure(go.Scatter(x=[0, 1], y=[0, 1]), layout=dict(title=title)), "t")
    layout = json.loads(figure.json.replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&"))["layout"]
    assert layout["title"]["text"] == "<br>".join(lines) and figure.title == title
    assert layout["modebar"]["orientation"] == "v" and layout["margin"]["r"] >= MODEBAR_PX
    assert wrap_title("short") == ["short"] and wrap_title("") == []


def test_scatter_labels_are_kept_apart():
    """#35 item 4: labels of close points in the intra/inter scatter overlapped; only points far
    enough from every labelled one are labelled, and that label names the close ones too (#71:
    four methods on one spot showed one clipped name)."""
    from cflpipe.report.figures import label_apart, together_text

    points = {"a": (50.0, 90.0), "b": (50.5, 89.8), "c": (70.0, 60.0), "d": (30.0, 89.9), "e": (70.0, 60.0)}
    assert label_apart(points, 3.0) == {"a": ["a", "b"], "c": ["c", "e"], "d": ["d"]}
    assert label_apart(points, 0.1) == {"a": ["a"], "b": ["b"], "c": ["c", "e"], "d": ["d"]}
    assert together_text(["a", "b", "c", "d"]) == "a, b, c<br>d"


def test_a_mean_that_rounds_to_zero_reads_zero_not_minus_zero():
    from cflpipe.report.tables import fixed, format_mean_std

    assert format_mean_std(-0.001, 0.03, 2) == "0.00 ± 0.03" and fixed(-0.004, 2) == "0.00"
    assert fixed(-0.006, 2) == "-0.01" and fixed(0.0, 1) == "0.0" and format_mean_std(-0.5, 0.1, 1) == "-0.5 ± 0.1"


def test_two_seeds_are_too_few_to_test_and_the_verdict_says_so_in_words():
    from cflpipe.report.tables import ACCURACY, paper_table, verdict

    two = pd.DataFrame([{"scenario": "a", "method": m, "seed": k, "acc_macro": v}
                        for m, values in (("x", (0.54, 0.55)), ("y", (0.23, 0.34))) for k, v in enumerate(values)])
    table = paper_table(two, ["a"], ["x", "y"], ACCURACY)
    assert not table.cell("x", "a").bold and not table.cell("x", "a").tied and not table.cell("y", "a").tied
    assert table.notes[0].startswith("Two seeds: too few to test")
    best = {0: 0.9, 1: 0.91, 2: 0.92}
    assert verdict(best, {0: 0.5, 1: 0.52, 2: 0.49}).startswith("separated by a paired t-test over 3 seeds (p = ")
    assert verdict(best, {0: 0.95, 1: 0.85, 2: 0.9}).startswith("not separated at n = 3 (p = ")
    assert verdict({0: 0.9, 1: 0.9}, {0: 0.1, 1: 0.2}) == "too few seeds to test (n = 2)"


def test_the_report_opens_with_who_won_per_scenario(built):
    html = built["index"].read_text()
    glance = html[html.index('<section id="glance">'):html.index('<section id="setup">')]
    spec = built["spec"]
    rows = pd.read_parquet(built["aggregate"] / "summary.parquet")
    for scenario in SCENARIOS:
        mine = rows[(rows["scenario"] == scenario) & (rows["method"] != "oracle")]
        best = mine.sort_values("acc_macro_mean", ascending=False, kind="stable").iloc[0]
        # equal means (FedProx with a tiny μ trains FedAvg's bits) are a tie, named together
        tied = [spec.method_label(m) for m in mine[mine["acc_macro_mean"] == best["acc_macro_mean"]]["method"]]
        names = tied[0] if len(tied) == 1 else ", ".join(tied[:-1]) + " and " + tied[-1]
        assert f"<strong>{names}</strong> <span class=\"num\">{best['acc_macro_mean'] * 100:.1f} %</span>" in glance
    assert glance.count("separated") + glance.count("too few seeds") + glance.count("tied:") >= len(SCENARIOS)
    # no method but the Oracle (told the groups) clusters here: no ARI columns
    assert "best ARI" not in glance and 'id="glance-rank"' in glance
    # the same answers as text, which `cflpipe report` prints at the end of a workflow
    lines = (built["index"].parent / "glance.txt").read_text().splitlines()
    assert len(lines) == len(SCENARIOS) + 1 and lines[-1].startswith("best average rank over")
    for scenario, line in zip(SCENARIOS, lines):
        assert line.startswith(f"{spec.scenario_label(scenario)}: best personalized accuracy ")
        mine = rows[(rows["scenario"] == scenario) & (rows["method"] != "oracle")]
        assert f"{mine['acc_macro_mean'].max() * 100:.1f} %" in line


def test_the_setup_says_how_many_training_splits_evaluations_read():
    import pandas as pd

    from cflpipe.report.sections import _evaluation_text, _final_counts
    from cflpipe.spec._models import Training

    runs = pd.DataFrame({"scenario": ["a", "a", "b", "c"], "train_evaluated_clients": [6, 7, 0, 12]})
    auto = Training(eval_every=1)
    assert _evaluation_text(auto, 12, _final_counts(runs, "a")) == (
        "round (training splits of a seeded sample of 6–7 of 12 clients, so that an evaluation costs no more than "
        "a training round)")
    assert _evaluation_text(auto, 12, _final_counts(runs, "b")) == (
        "round (test splits only: every client's already costs a training round)")
    assert _evaluation_text(auto, 12, _final_counts(runs, "c")) == "round"  # every client's
    assert _evaluation_text(Training(eval_every=2, eval_train=False), 12, []) == "2 rounds (test splits only)"
    assert _evaluation_text(Training(eval_train=True), 12, _final_counts(runs.drop(columns="train_evaluated_clients"),
                                                                         "a")) == "5 rounds"


def test_the_setup_says_when_full_evaluations_read_a_sample_of_the_clients():
    import pandas as pd

    from cflpipe.report.sections import _evaluation_text, _final_counts
    from cflpipe.spec._models import Training

    runs = pd.DataFrame({"scenario": ["a", "a", "b"], "evaluated_clients": [1000, 1000, 12]})
    every = Training(eval_every=1, eval_train=False)
    assert _evaluation_text(every, 10_000, [], _final_counts(runs, "a", "evaluated_clients")) == (
        "round (test splits only): a seeded sample of 1,000 of 10,000 clients (the same for every method; "
        "training.full_eval_clients)")
    assert _evaluation_text(every, 12, [], _final_counts(runs, "b", "evaluated_clients")) == \
        "round (test splits only)"
    sampled = Training(eval_every=1, eval_train=False, eval_clients=100)
    assert _evaluation_text(sampled, 10_000, [], _final_counts(runs, "a", "evaluated_clients")) == (
        "round (test splits only): a seeded sample of 100 clients, a seeded sample of 1,000 of 10,000 clients "
        "(the same for every method; training.full_eval_clients) in the last round")


def test_at_a_glance_says_a_tie_when_the_best_means_are_equal():
    """ARI 1.00 in every seed for two methods is a tie, not a winner and a runner-up."""
    from types import SimpleNamespace

    from cflpipe.report.sections import Sections

    per_seed = pd.DataFrame([{"scenario": "s", "method": m, "seed": k, "ari": v}
                             for m, values in (("ifca", [1.0, 1.0, 1.0]), ("flhc", [1.0, 1.0, 1.0]),
                                               ("cfl", [0.5, 0.6, 0.7])) for k, v in enumerate(values)])
    sections = Sections.__new__(Sections)
    sections.view = SimpleNamespace(per_seed=per_seed, label=str.upper)
    tie = sections._leader("s", ["ifca", "flhc", "cfl"], "ari", 1.0, 2, "")
    assert (tie["best"], tie["next"], tie["verdict"]) == ("IFCA and FLHC", "CFL", "tied: equal means over 3 seeds")
    alone = sections._leader("s", ["ifca", "cfl"], "ari", 1.0, 2, "")
    assert alone["best"] == "IFCA" and alone["verdict"].startswith("separated")


def test_at_a_glance_names_no_best_clustering_where_none_recovered_the_groups():
    from types import SimpleNamespace

    from cflpipe.report.sections import RECOVERED_ARI, Sections

    per_seed = pd.DataFrame([{"scenario": "s", "method": m, "seed": k, "ari": v}
                             for m, values in (("fedac", [0.03, 0.02, 0.01]), ("cfl", [0.0, 0.01, 0.0]))
                             for k, v in enumerate(values)])
    sections = Sections.__new__(Sections)
    sections.view = SimpleNamespace(per_seed=per_seed, label=str.upper)
    none = sections._leader("s", ["fedac", "cfl"], "ari", 1.0, 2, "")
    assert none["best"] == "none recovered the groups" and none["value"] == "(highest: FEDAC 0.02)"
    assert none["next"] is None and str(RECOVERED_ARI) in none["verdict"]


def test_an_axis_line_credits_a_share_only_to_the_methods_that_have_one():
    """A tie on the new clients' accuracy between FedAvg (no clusters: no share) and IFCA says
    whose share it is; equal shares of tied clustered methods are said once."""
    from types import SimpleNamespace

    from cflpipe.report.sections import Sections

    rows = [("fedavg", 0.5, float("nan")), ("ifca", 0.5, 0.75), ("ifca2", 0.5, 0.75), ("cfl", 0.4, 0.5)]
    per_seed = pd.DataFrame([{"scenario": "s", "method": m, "seed": k, "new_acc_macro": acc, "new_joined": joined}
                             for m, acc, joined in rows for k in range(3)])
    sections = Sections.__new__(Sections)
    sections.view = SimpleNamespace(per_seed=per_seed, label=str.upper)
    also = (("new_joined", "placed with their group", "{:.2f}"),)
    mixed = sections._axis_leader("s", ["fedavg", "ifca", "cfl"], "new_acc_macro", also)
    assert mixed["best"] == "FEDAVG and IFCA" and mixed["best_also"] == (
        "FEDAVG: no clusters / IFCA: placed with their group 0.75")
    same = sections._axis_leader("s", ["ifca", "ifca2", "cfl"], "new_acc_macro", also)
    assert same["best_also"] == "placed with their group 0.75" and same["next_also"] == "placed with their group 0.50"
    alone = sections._axis_leader("s", ["fedavg", "cfl"], "new_acc_macro", also)
    assert alone["best"] == "FEDAVG" and alone["best_also"] == ""
