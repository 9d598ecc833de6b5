"""What FedTSDP's Hopkins statistic (Eq. 6, `cflpipe.clustering.hopkins`) reads from points shaped
like its gate's: m clients' softmax outputs on B = 50 public samples of C = 10 classes, flattened
to 500 dimensions (docs/robustness.md, "FedTSDP's Hopkins gate"). For m = 18, 20, 50 and 100
clients, with no groups and with 3 groups of growing separation (the ratio of the mean distance
between groups to the mean distance within them), the mean and spread of H over 200 draws of its
random points at m̃ = round(0.1·m) (the paper's), 5 and m, and how often one draw passes h_th.

    python benchmarks/fedtsdp_hopkins_levels.py [--threshold 0.65]
"""

from __future__ import annotations

import argparse

import numpy as np

from cflpipe.clustering import hopkins

B, C = 50, 10


def softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def outputs(m: int, groups: int, separation: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """m flattened softmax outputs: logits of a shared base, a group offset and per-client noise."""
    base = rng.normal(0, 1.5, (B, C))
    centers = [base + rng.normal(0, separation, (B, C)) for _ in range(groups)]
    labels = np.arange(m) % groups
    return np.stack([softmax(centers[g] + rng.normal(0, 1.0, (B, C))).ravel() for g in labels]), labels


def distance_ratio(points: np.ndarray, labels: np.ndarray) -> float:
    d = np.linalg.norm(points[:, None] - points[None], axis=-1)
    same = (labels[:, None] == labels[None]) & ~np.eye(len(labels), dtype=bool)
    other = labels[:, None] != labels[None]
    return float(d[other].mean() / d[same].mean()) if other.any() else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=0.65, help="h_th (the paper's 0.65)")
    parser.add_argument("--draws", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| m | groups | between/within distance | m̃ = 0.1·m: H (sd), share > h_th | m̃ = 5 | m̃ = m |")
    print("|---:|---:|---:|---|---|---|")
    for m in (18, 20, 50, 100):
        for groups, separation in ((1, 0.0), (3, 0.5), (3, 0.8), (3, 1.2)):
            points, labels = outputs(m, groups, separation, rng)
            cells = []
            for sample in (max(1, round(0.1 * m)), min(5, m), m):
                h = np.array([hopkins(points, sample, seed=s) for s in range(args.draws)])
                cells.append(f"{h.mean():.3f} ({h.std():.3f}), {(h > args.threshold).mean():.2f}")
            ratio = "–" if groups == 1 else f"{distance_ratio(points, labels):.2f}"
            print(f"| {m} | {groups if groups > 1 else 'none'} | {ratio} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
