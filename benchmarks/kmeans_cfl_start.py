"""K-means CFL's server at 1,000 and 10,000 clients, each round's K-means afresh (the default,
n_init restarts over every client's model) against carried from the last round's clusters
(`kmeans_start: last`, clustering/carried.py), #70 item 2: training and server seconds a round
over the rounds after the first, the heaviest server round and peak RSS, each configuration in a
fresh process (`cflpipe bench --part scale`'s workload: LEAF Synthetic, one client per device,
100 a round, the paper MLP, clustering from round 1, K = 4, the default's 10 restarts).

    python benchmarks/kmeans_cfl_start.py [--clients 1000 10000] [--rounds 25] [--starts fresh last]

The clustering and accuracy half: benchmarks/kmeans_cfl_start.yaml. Figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json

from cflpipe.bench_scale import measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--starts", nargs="+", choices=("fresh", "last"), default=["fresh", "last"])
    parser.add_argument("--output", help="also write the rows as JSON")
    args = parser.parse_args()
    rows = []
    print("| clients | K-means starts | training s a round | server s a round | heaviest server round | "
          "server / training | heaviest round's server / its training | heaviest later round / median training | "
          "peak RSS MiB |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    for clients in args.clients:
        for start in args.starts:
            params = {"cluster_start": 1, "clusters": 4, "kmeans_start": start}
            row = {**measure("kmeans_cfl", params, clients, rounds=args.rounds, limit_s=1800), "start": start}
            rows.append(row)
            if "stopped" in row:
                print(f"| {clients:,} | {start} | stopped: {row['stopped']} | | | | | | |", flush=True)
                continue
            print(f"| {clients:,} | {start} | {row['train_s']:.3f} | {row['server_s']:.3f} | {row['server_max_s']:.3f} | "
                  f"{row['server_s'] / row['train_s']:.2f} | {row['server_max_s'] / row['train_at_server_max_s']:.2f} | "
                  f"{row['server_later_max_s']:.3f} / {row['train_median_s']:.3f} | "
                  f"{row['peak_rss_mib']:,.0f} |", flush=True)
    if args.output:
        with open(args.output, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
