"""FedTSDP's Hopkins gate, round by round, in one run (docs/robustness.md, "FedTSDP's Hopkins
gate"): trains the run as `cflpipe train` does and, each round, beside the H the gate drew,
the mean and spread of H over 200 draws of Eq. 6's random points on the same outputs at the run's
m̃, at m̃ = 0.1·m and at m̃ = m, and the share of draws over h_th. The run's own bytes are what they
would be without the probe (its draws use their own seeds).

    python benchmarks/fedtsdp_gate_probe.py SPEC SCENARIO METHOD SEED
"""

from __future__ import annotations

import sys

import numpy as np

import cflpipe.methods.fedtsdp as fedtsdp
from cflpipe.cli import main as cli

DRAWS = 200


def main() -> None:
    spec, scenario, method, seed = sys.argv[1:5]
    rows = []
    drawn = fedtsdp.hopkins

    def probed(points, samples, *, seed=0):
        h = drawn(points, samples, seed=seed)
        m = points.shape[0]
        cells = {}
        for name, size in (("run", samples), ("0.1m", max(1, round(0.1 * m))), ("m", m)):
            values = np.array([drawn(points, size, seed=10_000 * k + size) for k in range(1, DRAWS + 1)])
            cells[name] = values
        rows.append((h, samples, cells))
        return h

    fedtsdp.hopkins = probed
    cli(["train", "--config", spec, "--scenario", scenario, "--method", method, "--seed", seed, "--force",
         "--quiet"])
    threshold = 0.65
    print(f"| round | H drawn | m̃ | E[H] (sd), share > {threshold} at the run's m̃ | at 0.1·m | at m |")
    print("|---:|---:|---:|---|---|---|")
    for number, (h, samples, cells) in enumerate(rows, start=1):
        text = [f"{v.mean():.3f} ({v.std():.3f}), {(v > threshold).mean():.2f}" for v in cells.values()]
        print(f"| {number} | {h:.3f} | {samples} | " + " | ".join(text) + " |")


if __name__ == "__main__":
    main()
