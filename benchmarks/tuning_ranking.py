"""How the ranking of methods changes between the shared learning rate and per-method tuned
learning rates: reads the aggregates of config/experiments/tuning_default_shared.yaml and
config/experiments/tuning_default.yaml (run both with snakemake first) and prints Markdown tables
for docs/tuning.md: per scenario the final personalized accuracy of every method under both
protocols with its rank and the chosen lr, Kendall's τ between the two rankings, and the
methods' average ranks over the scenarios they all run on.

    python benchmarks/tuning_ranking.py [SHARED_RESULTS] [TUNED_RESULTS]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
from scipy.stats import kendalltau

from cflpipe.report.ranks import rank_scores
from cflpipe.spec import load_spec


def summary(results: Path) -> pd.DataFrame:
    return pd.read_parquet(results / "aggregate" / "summary.parquet").set_index(["scenario", "method"])


def main(shared_dir: str = "results/tuning_default_shared", tuned_dir: str = "results/tuning_default") -> None:
    spec = load_spec("config/experiments/tuning_default.yaml")
    shared, tuned = summary(Path(shared_dir)), summary(Path(tuned_dir))
    label = spec.method_label
    scores = {}
    for name, table in (("shared", shared), ("tuned", tuned)):
        scores[name] = table["acc_macro_mean"].unstack("scenario")  # methods × scenarios
    print("| scenario | Kendall τ (shared vs tuned ranking) | best, shared lr | best, tuned lr |")
    print("|---|---:|---|---|")
    for s in spec.scenarios:
        a, b = scores["shared"][s].dropna(), scores["tuned"][s].dropna()
        common = a.index.intersection(b.index)
        tau = kendalltau(a[common], b[common]).statistic
        print(f"| {s} | {tau:.2f} | {label(a.idxmax())} ({a.max():.3f}) | {label(b.idxmax())} ({b.max():.3f}) |")
    print()
    for s in spec.scenarios:
        a, b = scores["shared"][s].dropna(), scores["tuned"][s].dropna()
        ra, rb = a.rank(ascending=False, method="min"), b.rank(ascending=False, method="min")
        print(f"**{s}**\n")
        print("| method | acc, lr 0.05 | rank | chosen lr | acc, tuned | rank | Δ rank |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for m in b.sort_values(ascending=False).index:
            chosen = spec.chosen_path(s, m)
            chosen = Path(tuned_dir) / chosen.relative_to(spec.results_dir)
            lr = json.loads(chosen.read_text())["values"]["lr"] if chosen.is_file() else "–"
            print(f"| {label(m)} | {a[m]:.3f} | {ra[m]:.0f} | {lr} | {b[m]:.3f} | {rb[m]:.0f} | "
                  f"{int(ra[m] - rb[m]):+d} |")
        print()
    everywhere = [m for m in spec.methods if scores["shared"].loc[m].notna().all()] \
        if set(spec.methods) <= set(scores["shared"].index) else []
    if everywhere:
        print("Average rank over the five scenarios (methods that run on all of them):\n")
        print("| method | shared lr | tuned lr |")
        print("|---|---:|---:|")
        avg = {k: rank_scores(v.loc[everywhere].T).mean() for k, v in scores.items()}
        for m in avg["tuned"].sort_values().index:
            print(f"| {label(m)} | {avg['shared'][m]:.2f} | {avg['tuned'][m]:.2f} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
