"""FCCA's clustering round by round (#68 item 3), from runs evaluated every round
(`--set training.eval_every=1`: evaluation does not change training, so their figures at rounds
10, 20, … are the spec's own).

Per run and round: the ARI of the clustering against the true groups, the ARI between the
clusterings of consecutive rounds (how much k-means on a fresh D moves), and what the server's
similarity D reads: the mean D of same-group pairs less that of other pairs (the groups' signal),
in units of the spread (std) of D over all pairs, and the rank correlations (Spearman, over the
pairs) of D with "same group" and with the similarity of the two clients' label mixes (cosine of
their label histograms, the labels as the client sees them).

    python benchmarks/fcca_trace.py SPEC --scenario S --results DIR [--method fcca] [--every 10]

prints a table per run (every `--every`-th round, and the last) and a summary over the last half of
the rounds.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from scipy.stats import spearmanr
from sklearn.metrics import adjusted_rand_score

from cflpipe.spec import load_spec


def label_mix_similarity(stats: pd.DataFrame) -> np.ndarray:
    """Cosine of every pair of clients' label histograms (clients in id order)."""
    counts = stats.sort_values("client")[[c for c in stats.columns if c.startswith("label_")]].to_numpy(float)
    unit = counts / np.linalg.norm(counts, axis=1, keepdims=True).clip(1e-12)
    return unit @ unit.T


def round_figures(similarity: pd.DataFrame, clusters: pd.DataFrame, mix: np.ndarray) -> pd.DataFrame:
    rows = []
    previous = None
    for r, assigned in clusters.groupby("round", sort=True):
        assigned = assigned.sort_values("client")
        labels, truth = assigned["cluster"].to_numpy(), assigned["true_group"].to_numpy()
        ids = assigned["client"].to_numpy()
        d = similarity[similarity["round"] == r].pivot(index="client", columns="other", values="value")
        keep = np.isin(ids, d.index) & np.isin(ids, d.columns)  # a sampled evaluation's pairs only
        if not keep.any():
            continue
        labels, truth, ids = labels[keep], truth[keep], ids[keep]
        d = d.loc[ids, ids].to_numpy()
        upper = np.triu_indices(len(ids), 1)
        values = d[upper]
        same = (truth[:, None] == truth[None, :])[upper]
        spread = float(np.nanstd(values))
        row = {"round": int(r), "ari": adjusted_rand_score(truth, labels),
               "ari_to_previous": np.nan if previous is None else adjusted_rand_score(previous, labels),
               "signal": float(np.nanmean(values[same]) - np.nanmean(values[~same])),
               "spread": spread,
               "rho_group": spearmanr(values, same.astype(float), nan_policy="omit").statistic,
               "rho_label_mix": spearmanr(values, mix[np.ix_(ids, ids)][upper], nan_policy="omit").statistic}
        row["signal_in_spreads"] = row["signal"] / spread if spread > 0 else np.nan
        rows.append(row)
        previous = labels
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--results", required=True, help="the runs' results_dir (e.g. results/fcca-trace)")
    parser.add_argument("--method", default="fcca")
    parser.add_argument("--every", type=int, default=10, help="print every N-th round (default 10)")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    # the runs' own partition where they wrote one, else the spec's (the same scenario and seed)
    traced = spec.model_copy(update={"results_dir": args.results}).partition_dir(args.scenario) / "stats.parquet"
    stats = pd.read_parquet(traced if traced.exists() else spec.partition_dir(args.scenario) / "stats.parquet")
    mix = label_mix_similarity(stats)
    tails = []
    for seed in spec.seeds:
        run = spec.model_copy(update={"results_dir": args.results}).run_dir(args.scenario, args.method, seed)
        if not (run / "similarity.parquet").exists():
            continue
        figures = round_figures(pd.read_parquet(run / "similarity.parquet"), pd.read_parquet(run / "clusters.parquet"),
                                mix)
        last = int(figures["round"].max())
        shown = figures[(figures["round"] % args.every == 0) | (figures["round"] == last)]
        print(f"\n{args.scenario} / {args.method} / seed {seed} ({run})")
        print(shown.to_markdown(index=False, floatfmt=".3f"))
        tail = figures[figures["round"] > last / 2].assign(seed=seed)
        tails.append(tail)
    if tails:
        tail = pd.concat(tails)
        print(f"\nover the last half of the rounds (seeds {sorted(int(k) for k in tail['seed'].unique())}), "
              f"mean (min–max):")
        for column in ("ari", "ari_to_previous", "signal", "spread", "signal_in_spreads", "rho_group", "rho_label_mix"):
            values = tail[column].to_numpy(float)
            values = values[np.isfinite(values)]
            if not len(values):
                continue
            print(f"  {column}: {values.mean():.3f} ({values.min():.3f}–{values.max():.3f})")


if __name__ == "__main__":
    main()
