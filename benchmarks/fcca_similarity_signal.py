"""What FCCA's similarity D carries, per evaluation round of one run (docs/robustness.md, FCCA at
its paper's settings): the same-group/other-group ratio of D's means, the same-group excess of the
row-centered D (what the k-means sees) against the spread of its off-diagonal entries, and the
Spearman correlation of D with "same group" and with the cosine of two clients' label histograms.

    python benchmarks/fcca_similarity_signal.py RESULTS/runs/S/fcca/seed0 RESULTS/partitions/S
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from scipy.stats import spearmanr


def signal(run: str, partition: str) -> pd.DataFrame:
    similarity = pd.read_parquet(f"{run}/similarity.parquet")
    stats = pd.read_parquet(f"{partition}/stats.parquet").sort_values("client")
    groups = stats["group"].to_numpy()
    labels = stats[[c for c in stats.columns if c.startswith("label_")]].to_numpy(float)
    labels = labels / np.linalg.norm(labels, axis=1, keepdims=True)
    mix = labels @ labels.T
    m = len(groups)
    off = ~np.eye(m, dtype=bool)
    same = (groups[:, None] == groups[None, :]) & off
    other = groups[:, None] != groups[None, :]
    rows = []
    for round_number, frame in similarity.groupby("round"):
        d = np.full((m, m), np.nan)
        d[frame["client"], frame["other"]] = frame["value"]
        centered = d - np.nanmean(d, axis=1, keepdims=True)
        rows.append({"round": int(round_number),
                     "same/other": np.nanmean(d[same]) / np.nanmean(d[other]),
                     "excess": np.nanmean(centered[same]) - np.nanmean(centered[other]),
                     "spread": float(np.nanstd(centered[off])),
                     "rho_group": spearmanr(centered[off], same[off].astype(float)).statistic,
                     "rho_label_mix": spearmanr(centered[off], mix[off]).statistic})
    return pd.DataFrame(rows)


if __name__ == "__main__":
    print(signal(sys.argv[1], sys.argv[2]).round(4).to_string(index=False))
