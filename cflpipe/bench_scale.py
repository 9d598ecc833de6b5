"""Every clustered method at cross-device populations (`cflpipe bench --part scale`, #59).

FedAvg (the reference) and every registered clustered method that is not told the groups (variants
aside) run a few rounds on LEAF Synthetic with one client per device at each population; each
configuration runs in a fresh process (its own peak RSS), watched: one that passes the time or
memory limit is stopped and its row says so. A round's seconds are split into training (the
sampled clients' local work, and whatever else a method asks of clients), server (aggregation and
clustering) and evaluation (the run's default final evaluation, the last round's); then each
part's growth exponent, the log-log slope from the smallest to the largest population.

The workload is what a new user runs: the spec's default local training (5 steps of batch 32),
100 clients sampled a round (all of them below 100), the paper MLP, the conformance suite's
hyper-parameters (each method clusters within the first rounds) and K = 4, 4 rounds: the
first pays the process's start-up and the last holds the evaluation, so training and server are
the means of the two between (training's over those not lengthened by trainer auto's
measurements; the server's heaviest round of the first three is kept too, for methods that cluster
once).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POPULATIONS = (100, 1000, 10000)
SAMPLED = 100
PARTS = ("train_s", "server_s", "eval_s", "peak_rss_mib")

_CHILD = """
import json, resource, sys, time
import numpy as np, pandas as pd, torch
torch.set_num_threads(1)
from cflpipe.fl.engine import train_run
from cflpipe.spec import parse_spec
case, tmp = json.loads(sys.argv[1]), sys.argv[2]
# A method that needs the server's public data gets a public pool from the training data, as the
# conformance suite's scenario does (LEAF Synthetic has no public split of its own).
public = {"pool": "train", "public": {"size": 40}} if case["public"] else {}
spec = parse_spec({
    "seeds": [0],
    "training": {"model": "mlp", "rounds": case["rounds"], "clients_per_round": case["sampled"],
                 "eval_every": case["rounds"], "device": case["device"],
                 **case["training"]},
    "scenarios": {"scale": {"dataset": {"name": "synthetic", "devices": case["clients"], "max_samples": 100},
                            "clients": case["clients"], "partition": [{"kind": "natural"}], **public}},
    "methods": {case["method"]: case["params"]},
    "results_dir": tmp, "data_dir": tmp,
})
start = time.perf_counter()
train_run(spec, "scale", case["method"], 0, force=True, progress=False)
wall = time.perf_counter() - start
whole = pd.read_parquet(spec.run_dir("scale", case["method"], 0) / "timing.parquet")
rounds = whole.iloc[:-1]  # the last round holds the (only) evaluation
# Training and server over the same rounds: not the process's first (it pays its start-up), nor
# those trainer auto measured in (flagged warm-up) where any other remains.
later = rounds.iloc[1:]
steady = later[~later["warmup"].astype(bool)]
steady = steady if len(steady) else later
heaviest = rounds["server_seconds"].idxmax()
print(json.dumps({
    "train_s": float(steady["train_seconds"].mean()),
    "server_s": float(steady["server_seconds"].mean()),
    "server_max_s": float(rounds.loc[heaviest, "server_seconds"]),
    "train_at_server_max_s": float(rounds.loc[heaviest, "train_seconds"]),
    # a method whose first clustering is its heaviest round: the rounds after it
    "server_later_max_s": float(later["server_seconds"].max()) if len(later) else float("nan"),
    "train_median_s": float(steady["train_seconds"].median()),
    "eval_s": float(whole["eval_seconds"].iloc[-1]),
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "wall_s": wall,
}))
"""


def methods_measured() -> list[tuple[str, dict]]:
    """FedAvg and every registered clustered method not told the groups (no variant), with the
    conformance suite's hyper-parameters and K = 4."""
    from cflpipe.registry import all_methods
    from cflpipe.testing import hyperparams

    chosen = [("fedavg", {})]
    for name, info in all_methods().items():
        caps = info.capabilities
        if ":" in name or info.base is not None or not caps.clustered or caps.needs_groups:
            continue
        params = dict(hyperparams(name))
        if caps.k_param:
            params[caps.k_param] = 4
        chosen.append((name, params))
    return chosen


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            line = next(line for line in status if line.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration):
        return 0.0


def measure(method: str, params: dict, clients: int, rounds: int = 4, sampled: int = SAMPLED,
            training: dict | None = None, device: str = "cpu", limit_s: float = 600.0,
            limit_mib: float = 8192.0) -> dict:
    """One configuration in a fresh process. Past `limit_s` seconds or `limit_mib` MiB of RSS it
    is stopped: the row's `stopped` says which, with the RSS and seconds reached. The process's
    folder (its data and checkpoints) is this one's to remove, whatever became of the process."""
    from cflpipe.registry import method_info

    case = {"method": method, "params": params, "clients": clients, "rounds": rounds,
            "sampled": min(sampled, clients), "device": device, "training": training or {},
            "public": method_info(method).capabilities.needs_public}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    row = {"method": method, "clients": clients, "sampled": case["sampled"], "rounds": rounds}
    folder = tempfile.mkdtemp(prefix="cflpipe-scale-")
    try:
        # stderr to a file: a pipe nobody reads while the child runs would stop it once full
        with open(Path(folder) / "stderr.txt", "w+") as err:
            child = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(case), folder],
                                     stdout=subprocess.PIPE, stderr=err, text=True, env=env)
            start, peak, stopped = time.perf_counter(), 0.0, None
            while child.poll() is None:
                peak = max(peak, _rss_mib(child.pid))
                if peak > limit_mib:
                    stopped = f"RSS over {limit_mib:.0f} MiB"
                elif time.perf_counter() - start > limit_s:
                    stopped = f"over {limit_s:.0f} s"
                if stopped:
                    child.kill()
                    child.communicate()
                    return {**row, "stopped": stopped, "peak_rss_mib": peak, "wall_s": time.perf_counter() - start}
                time.sleep(0.1)
            out, _ = child.communicate()
            if child.returncode:
                err.seek(0)
                last = (err.read().strip().splitlines() or ["?"])[-1][:300]
                return {**row, "stopped": f"failed: {last}", "wall_s": time.perf_counter() - start}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {**row, **json.loads(out.splitlines()[-1])}


def exponents(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per method, each part's log-log slope from its smallest to its largest measured population."""
    slopes = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = sorted((r for r in rows if r["method"] == method and "stopped" not in r), key=lambda r: r["clients"])
        if len(mine) < 2:
            continue
        a, b = mine[0], mine[-1]
        span = math.log(b["clients"] / a["clients"])
        slopes[method] = {part: math.log(max(b[part], 1e-4) / max(a[part], 1e-4)) / span for part in PARTS}
    return slopes


def table(rows: list[dict]) -> str:
    """The rows as a markdown table: per method, each population's parts and the exponents."""
    if not rows:
        return "(no configuration measured)"
    slopes = exponents(rows)
    populations = sorted({r["clients"] for r in rows})
    head = " / ".join(f"{p:,}" for p in populations)
    lines = [f"| method | training s a round ({head} clients) | server s a round | the server's heaviest round | "
             f"server / training at {populations[-1]:,} | final evaluation s | peak RSS MiB | exponents: training / "
             "server / evaluation / RSS |", "|---|---|---|---|---|---|---|---|"]
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = {r["clients"]: r for r in rows if r["method"] == method}

        def cell(part, digits):
            def one(row):
                if row is None:
                    return "–"
                if "stopped" in row:  # why it stopped, said once: in the RSS column, with what it reached
                    if part != "peak_rss_mib":
                        return "–"
                    return f"≥{row[part]:,.0f} ({row['stopped']})" if part in row else row["stopped"]
                return f"{row[part]:,.{digits}f}" if part in row else "–"
            return " / ".join(one(mine.get(p)) for p in populations)
        last = mine.get(populations[-1], {})
        ratio = f"{last['server_s'] / last['train_s']:.2f}" if "server_s" in last else "–"
        slope = slopes.get(method)
        lines.append(f"| {method} | {cell('train_s', 3)} | {cell('server_s', 3)} | {cell('server_max_s', 3)} | {ratio} | "
                     f"{cell('eval_s', 2)} | "
                     f"{cell('peak_rss_mib', 0)} | "
                     + (" / ".join(f"{slope[p]:.2f}" for p in PARTS) if slope else "–") + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """Log-log plot of each part against the population, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {"train_s": "training s a round", "server_s": "server s a round",
              "eval_s": "final evaluation s", "peak_rss_mib": "peak RSS MiB"}
    figure, axes = plt.subplots(1, 4, figsize=(19, 5))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    colours = plt.get_cmap("tab20")
    markers = "os^vD<>pP*X"
    for index, method in enumerate(methods):
        mine = sorted((r for r in rows if r["method"] == method and "stopped" not in r), key=lambda r: r["clients"])
        for axis, part in zip(axes, PARTS):
            # a part that took no measurable time (FedAvg's server) is drawn at 1e-4
            axis.plot([r["clients"] for r in mine], [max(r[part], 1e-4) for r in mine], "-" if index < 10 else "--",
                      marker=markers[index % len(markers)], color=colours(index % 20), label=method)
    axes[-1].axhline(3072, color="black", linewidth=0.8, linestyle=":")
    axes[-1].annotate("3 GiB", (min(r["clients"] for r in rows), 3072), fontsize=8, va="bottom", ha="left")
    for axis, part in zip(axes, PARTS):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("clients")
        axis.set_title(titles[part])
        axis.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, fontsize=8, loc="center right")
    figure.tight_layout(rect=(0, 0, 0.91, 1))
    figure.savefig(path, dpi=90)
    plt.close(figure)


def bench_methods_at_scale(populations=POPULATIONS, methods: list[str] | None = None, rounds: int = 4,
                           device: str = "cpu", output: str | None = None, plot_to: str | None = None,
                           limit_s: float = 600.0, limit_mib: float = 8192.0, client_store: str = "memory"
                           ) -> list[dict]:
    """Every configuration measured in turn, each row printed (and appended to `output` as a JSON
    line) as it comes, then the table and, with `plot_to`, the log-log plot. `client_store`:
    training.client_store of every run (disk: the client store memory-mapped; the rows say so)."""
    from cflpipe.errors import SpecError

    measured = methods_measured()
    if methods:
        unknown = sorted(set(methods) - {name for name, _ in measured})
        if unknown:
            raise SpecError(f"--method: {', '.join(unknown)} is not measured at scale; allowed: "
                            + ", ".join(name for name, _ in measured))
    if rounds < 3:
        raise SpecError(f"--rounds: the scale part needs at least 3 (a start-up round, a measured one, the "
                        f"evaluation), got {rounds}")
    rows = []
    for method, params in measured:
        if methods and method not in methods:
            continue
        for clients in sorted(populations):
            training = {"client_store": client_store} if client_store != "memory" else None
            row = measure(method, params, clients, rounds, training=training, device=device, limit_s=limit_s,
                          limit_mib=limit_mib)
            if training:
                row["client_store"] = client_store
            rows.append(row)
            if "stopped" in row:
                print(f"scale     {method:10s} clients={clients:6d}  stopped: {row['stopped']} "
                      f"(peak RSS {row.get('peak_rss_mib', 0):.0f} MiB, {row['wall_s']:.0f} s)", flush=True)
            else:
                print(f"scale     {method:10s} clients={clients:6d}  training {row['train_s']:7.3f} s  server "
                      f"{row['server_s']:7.3f} s (heaviest round {row['server_max_s']:7.3f})  evaluation "
                      f"{row['eval_s']:7.2f} s  peak RSS {row['peak_rss_mib']:6.0f} MiB", flush=True)
            if output:
                with open(output, "a") as out:
                    out.write(json.dumps(row) + "\n")
    print(table(rows), flush=True)
    if plot_to:
        plot(rows, plot_to)
    return rows
