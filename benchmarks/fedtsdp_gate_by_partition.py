"""What FedTSDP's Hopkins gate reads, by partition (docs/reproduction.md, "FedTSDP"): trains
FedTSDP at its paper's settings (20 clients, all every round, 2 local epochs of batch 50, lr 0.05,
momentum 0.5, lr × 0.95 a round) with the gate shut (h_th = 0.999, so that no clustering changes
what later rounds see), and each round records the expectation of H (Eq. 6 at the run's
m̃ = round(0.1·m) = 2) over DRAWS draws of its random points on the round's outputs, and the
share of those draws above the paper's h_th = 0.65: how often one round's single draw would open
the gate. Rounds 1..ROUNDS, seeds 0 and 1, on MNIST-1D and digits, under IID, Dirichlet 0.5 and
0.2, two labels per client and 4 label-swap groups (over IID). Prints one markdown table.

    python benchmarks/fedtsdp_gate_by_partition.py [--rounds 12] [--draws 300] [--seeds 0 1]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import yaml

import cflpipe.methods.fedtsdp as fedtsdp
from cflpipe.cli import main as cli

THRESHOLD = 0.65
PARTITIONS = {
    "IID": [{"kind": "iid"}],
    "Dirichlet 0.5": [{"kind": "dirichlet", "alpha": 0.5}],
    "Dirichlet 0.2": [{"kind": "dirichlet", "alpha": 0.2}],
    "two labels per client": [{"kind": "pathological", "labels_per_client": 2, "label_sets": "random"}],
    "4 label-swap groups": [{"kind": "iid"}, {"kind": "label_swap", "groups": 4}],
}
DATASETS = {"mnist1d": {"source": "test", "size": 1000}, "digits": {"source": "test"}}


def spec(rounds: int, seeds: list[int], results: Path) -> dict:
    scenarios = {}
    for data, public in DATASETS.items():
        for i, partition in enumerate(PARTITIONS.values()):
            scenarios[f"{data}-p{i}"] = {"dataset": data, "clients": 20, "pool": "train", "public": public,
                                         "partition": partition}
    return {"description": "FedTSDP's Hopkins gate by partition, gate shut", "seeds": seeds,
            "results_dir": str(results),
            "training": {"model": "mlp", "rounds": rounds, "clients_per_round": 20, "local_epochs": 2,
                         "batch_size": 50, "lr": 0.05, "momentum": 0.5, "lr_decay": 0.95, "eval_every": rounds},
            "scenarios": scenarios, "methods": {"fedtsdp": {"hopkins_threshold": 0.999}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    drawn = fedtsdp.hopkins
    per_round: list[np.ndarray] = []

    def probed(points, samples, *, seed=0):
        per_round.append(np.array([drawn(points, samples, seed=10_000 + k) for k in range(args.draws)]))
        return drawn(points, samples, seed=seed)

    fedtsdp.hopkins = probed
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(yaml.safe_dump(spec(args.rounds, args.seeds, Path(tmp) / "results")))
        rows = {}
        for data in DATASETS:
            for i, name in enumerate(PARTITIONS):
                scenario = f"{data}-p{i}"
                cli(["partition", "--config", str(path), "--scenario", scenario])
                means, shares = [], []
                for seed in args.seeds:
                    per_round.clear()
                    cli(["train", "--config", str(path), "--scenario", scenario, "--method", "fedtsdp",
                         "--seed", str(seed), "--quiet"])
                    h = np.stack(per_round)  # rounds × draws
                    means.append(h.mean(1))
                    shares.append((h > THRESHOLD).mean())
                m = np.concatenate(means)
                rows[(data, name)] = (m.min(), m.max(), m.mean(), min(shares), max(shares))
                print(f"{data} {name}: E[H] per round {m.min():.2f}–{m.max():.2f} (mean {m.mean():.3f}), "
                      f"draws over {THRESHOLD}: {min(shares):.2f}–{max(shares):.2f} by seed", flush=True)
    print(f"\n| data | partition | E[H], rounds 1–{args.rounds} (range; mean) | share of draws with H > {THRESHOLD} "
          f"(range over seeds {', '.join(map(str, args.seeds))}) |")
    print("|---|---|---|---|")
    for (data, name), (lo, hi, mean, s_lo, s_hi) in rows.items():
        print(f"| {data} | {name} | {lo:.2f}–{hi:.2f}; {mean:.3f} | {s_lo:.2f}–{s_hi:.2f} |")


if __name__ == "__main__":
    main()
