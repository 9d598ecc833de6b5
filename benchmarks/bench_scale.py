"""Server cost at cross-device scale: per-round time, peak memory and checkpoint size with
thousands of clients, each configuration in a fresh process (its own peak RSS).

Run: python benchmarks/bench_scale.py [--part kmeans|population|all] [--rounds 4] [--device cuda]
(on CUDA the trainer is `auto`, batched there; on the CPU sequential; peak GPU memory printed)

- kmeans: K-means CFL (AWCFL/MCFL's base) with every client training every round, at 500, 1,000
  and 2,000 clients: the server's seconds per round (and their ratio to the training's, #32 asks
  ≤ 1 at 1,000 clients) (k-means on all clients' latest models and the
  per-cluster averages), peak RSS, the size of the checkpoint and what one checkpoint during
  the run writes (its row blocks that changed, cflpipe/fl/checkpoint.py); and FedAvg on the same 2,000
  clients, the engine's own share.
- population: FedAvg, IFCA, FedAC and Ditto (personalized) at 350 and 3,500 clients (FEMNIST's
  number of writers) with 25 clients sampled per round: seconds per round should not grow with
  the population; memory grows only with what a method keeps per client.
Every clustered method at 100 / 1,000 / 10,000 clients is `cflpipe bench --part scale` (#59).

Data: LEAF Synthetic (embedded, 60 features, 10 classes), one client per device, at most 100
samples per device; the paper MLP. Local training is kept short (2 steps of batch 16) so that
the figures show the server's and the engine's share. The last round (the only evaluation) is
left out of the per-round medians.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, resource, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, {root!r})
import numpy as np, pandas as pd, torch
torch.set_num_threads(1)
from cflpipe.fl import resume
from cflpipe.fl.checkpoint import state_bytes
from cflpipe.fl.engine import train_run
from cflpipe.spec import parse_spec
case = json.loads({case!r})
checkpoints = []  # (seconds, bytes written) of each checkpoint
write_state = resume.write_state
def written():
    return int(next(line for line in open("/proc/self/io") if line.startswith("wchar")).split()[1])
def timed_write_state(path, state):
    before, start = written(), time.perf_counter()
    write_state(path, state)
    checkpoints.append((time.perf_counter() - start, written() - before))
resume.write_state = timed_write_state
with tempfile.TemporaryDirectory() as tmp:
    spec = parse_spec({{
        "seeds": [0],
        "training": {{"model": "mlp", "rounds": case["rounds"], "clients_per_round": case["sampled"],
                     "local_steps": 2, "batch_size": 16, "lr": 0.05, "eval_every": case["rounds"],
                     "checkpoint_every": 1, "device": case["device"],
                     "trainer": "auto" if case["device"] == "cuda" else "sequential",
                     "keep_state": True}},  # the last checkpoint whole, as those written during a run
        "scenarios": {{"scale": {{"dataset": {{"name": "synthetic", "devices": case["clients"], "max_samples": 100}},
                                 "clients": case["clients"], "partition": [{{"kind": "natural"}}]}}}},
        "methods": {{case["method"]: case["params"]}},
        "results_dir": tmp,
    }})
    start = time.perf_counter()
    train_run(spec, "scale", case["method"], 0, force=True, progress=False)
    wall = time.perf_counter() - start
    run = spec.run_dir("scale", case["method"], 0)
    whole = pd.read_parquet(run / "timing.parquet")
    timing = whole.iloc[:-1]
    print(json.dumps({{
        "round_s": float(np.median(timing["seconds"])),
        "server_s": float(np.median(timing["server_seconds"])),
        "train_s": float(np.median(timing["train_seconds"])),
        "eval_s": float(whole["eval_seconds"].iloc[-1]),  # the one (full) evaluation, the last round's
        "checkpoint_mib": state_bytes(run / "state" / "state.pt") / 2**20,
        # a checkpoint during the run: not the first (every row is new); NaN with a single one
        "checkpoint_write_mib": float(np.median([b for _, b in checkpoints[1:]] or [np.nan])) / 2**20,
        "checkpoint_s": float(np.median([s for s, _ in checkpoints[1:]] or [np.nan])),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if case["device"] == "cuda" else 0.0,
        "wall_s": wall,
    }}))
"""


def measure(method: str, clients: int, sampled: int, rounds: int, params: dict | None = None,
            device: str = "cpu") -> dict:
    case = json.dumps({"method": method, "clients": clients, "sampled": sampled, "rounds": rounds,
                       "params": params or {}, "device": device})
    child = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), case=case)],
                           capture_output=True, text=True)
    if child.returncode:
        sys.exit(f"{method} at {clients} clients failed:\n{child.stderr[-3000:]}")
    out = child.stdout
    return {"method": method, "clients": clients, "sampled": sampled, **json.loads(out.splitlines()[-1])}


def show(row: dict) -> None:
    print(f"{row['method']:10s} clients {row['clients']:5d} sampled {row['sampled']:5d}  round {row['round_s']:7.2f} s  "
          f"server {row['server_s']:7.2f} s  train {row['train_s']:7.2f} s  (ratio {row['server_s'] / row['train_s']:4.2f})  peak RSS {row['peak_rss_mib']:7.0f} MiB  "
          + (f"peak GPU {row['peak_gpu_mib']:7.0f} MiB  " if row["peak_gpu_mib"] else "")
          + f"checkpoint {row['checkpoint_mib']:7.1f} MiB, {row['checkpoint_write_mib']:7.1f} MiB written in "
          f"{row['checkpoint_s']:5.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("kmeans", "population", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    if args.part in ("kmeans", "all"):
        for clients in (500, 1000, 2000):
            show(measure("kmeans_cfl", clients, clients, args.rounds, {"clusters": 2, "cluster_start": 1},
                         args.device))
        # The engine's own share at that size: FedAvg on the same workload.
        show(measure("fedavg", 2000, 2000, args.rounds, device=args.device))
    if args.part in ("population", "all"):
        for method, params in (("fedavg", {}), ("ifca", {"clusters": 4}), ("fedac", {"clusters": 4}),
                               ("ditto", {})):
            for clients in (350, 3500):
                show(measure(method, clients, 25, args.rounds, params, args.device))


if __name__ == "__main__":
    main()
