"""#59's bars at the largest population measured: the server's seconds against the training's
(≤ 1), the peak RSS against 3 GiB, the final evaluation against two rounds' training; one line
per method and bar, drawn to scale, marked met or not.

    cflpipe bench --part scale --output scale.json      # or bench_methods_at_scale(output=FILE.jsonl)
    python benchmarks/check_scale.py scale.json [--strict]

--strict exits 1 when a bar is not met (docs/performance.md says why for each method that does not).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

BARS = (("server / training", lambda r: r["server_s"] / r["train_s"], 1.0),
        # a method that clusters once (FL+HC, FeSEM's start): that round's server against its training
        ("heaviest round's server / its training", lambda r: r["server_max_s"] / r["train_at_server_max_s"], 1.0),
        ("peak RSS / 3 GiB", lambda r: r["peak_rss_mib"] / 3072.0, 1.0),
        # #59: "within two training rounds": the training's seconds, not a round's server too (a
        # slow server would make the bar easier)
        ("final evaluation / 2 training rounds", lambda r: r["eval_s"] / (2 * r["train_s"]), 1.0))
WIDTH = 40  # characters for a ratio of 2


def rows_of(path: Path) -> list[dict]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    figures = json.loads(text)
    if "scale_methods" not in figures:
        sys.exit(f"{path}: no scale_methods: not the --output of `cflpipe bench --part scale`")
    return figures["scale_methods"]


def bar(ratio: float) -> str:
    filled = min(WIDTH, round(ratio / 2 * WIDTH))
    line = "█" * filled + " " * (WIDTH - filled)
    return line[:WIDTH // 2] + "|" + line[WIDTH // 2:] + ("▶" if ratio > 2 else " ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figures", type=Path)
    parser.add_argument("--strict", action="store_true")
    args = parser.parse_args()
    rows = rows_of(args.figures)
    largest = max(r["clients"] for r in rows)
    unmet = 0
    print(f"at {largest:,} clients; '|' marks the bar (ratio 1)")
    for row in (r for r in rows if r["clients"] == largest):
        if "stopped" in row:
            print(f"{row['method']:11s} stopped: {row['stopped']}")
            unmet += 1
            continue
        for name, ratio_of, limit in BARS:
            try:
                ratio = ratio_of(row)
            except (KeyError, ZeroDivisionError):
                continue  # a row from before the figure existed
            if not math.isfinite(ratio):
                print(f"{row['method']:11s} {name:38s} not measured ({ratio})")
                unmet += 1
                continue
            met = ratio <= limit
            unmet += not met
            print(f"{row['method']:11s} {name:38s} {bar(ratio)} {ratio:7.2f} {'met' if met else 'NOT met'}")
    print(f"{unmet} bar(s) not met")
    return 1 if args.strict and unmet else 0


if __name__ == "__main__":
    sys.exit(main())
