"""A figure at the final evaluation and over a run's last evaluations, per scenario × method, from
a spec's finished runs (docs/reproduction.md quotes FCCA's ARI this way: a final value is one draw
of a trajectory that moves from one evaluation to the next). For each scenario × method: the mean
± std (n − 1) over seeds of the final value, and the mean and range of every seed's last LAST
evaluated values (rounds.parquet), with each seed's own mean over them.

    python benchmarks/last_evaluations.py SPEC [--figure ari] [--last 5] [--methods a b ...]
        [--results DIR] [--every N]

`--results` reads runs trained into another folder (`--set results_dir=DIR`), `--every N` only
their rounds that are multiples of N: runs evaluated every round (`--set training.eval_every=1`)
against the spec's own, evaluated every 10th.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from cflpipe.spec import load_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--figure", default="ari", help="a column of rounds.parquet (default ari)")
    parser.add_argument("--last", type=int, default=5, help="evaluations counted from the end (default 5)")
    parser.add_argument("--methods", nargs="*", help="method entries (default: every one of the spec)")
    parser.add_argument("--results", help="the runs' results folder (default: the spec's results_dir)")
    parser.add_argument("--every", type=int, default=1, help="only rounds that are multiples of N (default 1)")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    if args.results:
        spec = spec.model_copy(update={"results_dir": args.results})
    print(f"| scenario | method | seeds | final {args.figure} | last {args.last} evaluations: mean (range) | "
          f"per seed: mean of its last {args.last} |")
    print("|---|---|---|---|---|---|")
    for scenario in spec.scenarios:
        for method in args.methods or list(spec.methods):
            finals, tails, seeds = [], [], []
            for seed in spec.seeds:
                path = spec.run_dir(scenario, method, seed) / "rounds.parquet"
                if not path.exists():
                    continue
                rounds = pd.read_parquet(path)
                values = rounds.loc[rounds["round"] % args.every == 0, args.figure].dropna().to_numpy()
                if not len(values):
                    continue
                finals.append(values[-1])
                tails.append(values[-args.last:])
                seeds.append(seed)
            if not finals:
                continue
            pooled = np.concatenate(tails)
            spread = f" ± {np.std(finals, ddof=1):.2f}" if len(finals) > 1 else ""
            own = ", ".join(f"{np.mean(t):.2f}" for t in tails)
            print(f"| {scenario} | {method} | {', '.join(map(str, seeds))} | {np.mean(finals):.2f}{spread} | "
                  f"{pooled.mean():.2f} ({pooled.min():.2f} to {pooled.max():.2f}) | {own} |")


if __name__ == "__main__":
    main()
