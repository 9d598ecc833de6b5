"""PFLlib's FedAvg client loop and cflpipe's FedAvg side by side on this machine (#48 item 4):
PFLlib's FedAvgCNN (582,026 parameters) at MNIST's shape, 20 clients of 60 random images, all
training every round, one local epoch of batch 10 (6 SGD steps a client), plain SGD.

PFLlib is imported from a checkout of github.com/TsingZ0/PFLlib (`--pfllib PATH`, the folder
holding system/): its own `clientAVG.train` (DataLoader, model, optimizer) reads its own
per-client .npz files, which this script writes in PFLlib's format. cflpipe runs FedAvg on the
same images as a `files` dataset with the bench's PFLlibCNN (the same layers) by reference, once
per trainer (auto, the default, then sequential and batched). Per SGD step: the median round's
training seconds over the steps of a round, fastest of `--repeats` interleaved repeats, in one
process with one torch thread.

    python benchmarks/pfllib_side_by_side.py --pfllib /path/to/PFLlib [--repeats 3] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch

CLIENTS, PER_CLIENT, TEST_PER_CLIENT, BATCH, LR = 20, 60, 10, 10, 0.01


def write_images(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((CLIENTS * (PER_CLIENT + TEST_PER_CLIENT), 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, len(x))
    train, test = CLIENTS * PER_CLIENT, CLIENTS * TEST_PER_CLIENT
    for split, rows in (("train", range(0, train)), ("test", range(train, train + test))):
        out = folder / "dataset" / "bench" / split
        out.mkdir(parents=True, exist_ok=True)
        per = PER_CLIENT if split == "train" else TEST_PER_CLIENT
        for c in range(CLIENTS):
            chunk = slice(rows.start + c * per, rows.start + (c + 1) * per)
            with open(out / f"{c}.npz", "wb") as handle:
                np.savez_compressed(handle, data={"x": x[chunk], "y": y[chunk]})
    return x[:train], y[:train], x[train:], y[train:]


def pfllib_rounds(system: Path, work: Path, rounds: int) -> list[float]:
    """Seconds of each round's client training with PFLlib's own clientAVG (every client, in order)."""
    sys.path.insert(0, str(system))
    from flcore.clients.clientavg import clientAVG
    from flcore.trainmodel.models import FedAvgCNN

    here = os.getcwd()
    os.chdir(work)  # PFLlib reads ../dataset/<name>/train/<id>.npz
    try:
        torch.manual_seed(0)
        global_model = FedAvgCNN(in_features=1, num_classes=10, dim=1024)
        args = SimpleNamespace(model=global_model, algorithm="FedAvg", dataset="bench", device="cpu",
                               save_folder_name="items", num_classes=10, batch_size=BATCH, local_learning_rate=LR,
                               local_epochs=1, few_shot=0, learning_rate_decay_gamma=0.99,
                               learning_rate_decay=False)
        clients = [clientAVG(args, c, PER_CLIENT, TEST_PER_CLIENT, train_slow=False, send_slow=False)
                   for c in range(CLIENTS)]
        seconds = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for client in clients:
                client.set_parameters(global_model)
                client.train()
            seconds.append(time.perf_counter() - t0)
            with torch.no_grad():  # FedAvg of equal clients (not timed: the server's part)
                for p, *others in zip(global_model.parameters(), *(c.model.parameters() for c in clients)):
                    p.copy_(torch.stack(others).mean(0))
        return seconds
    finally:
        os.chdir(here)


def cflpipe_rounds(folder: Path, images: tuple, trainer: str | None, rounds: int) -> pd.Series:
    from cflpipe.fl.engine import train_run
    from cflpipe.spec import parse_spec

    path = folder / "images.npz"
    if not path.exists():
        x_train, y_train, x_test, y_test = images
        np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    training = {"model": "cflpipe.bench:PFLlibCNN", "rounds": rounds, "clients_per_round": CLIENTS, "local_epochs": 1,
                "batch_size": BATCH, "lr": LR, "eval_every": rounds + 1, "checkpoint_every": rounds + 1,
                "device": "cpu", **({} if trainer is None else {"trainer": trainer})}
    spec = parse_spec({"seeds": [0], "training": training,
                       "scenarios": {"s": {"dataset": {"name": "files", "path": str(path), "classes": 10},
                                           "clients": CLIENTS, "partition": [{"kind": "iid"}]}},
                       "methods": {"fedavg": {}}, "results_dir": str(folder / f"results-{trainer or 'default'}")})
    result = train_run(spec, "s", "fedavg", 0, force=True, progress=False)
    timing = pd.read_parquet(result.run_dir / "timing.parquet")
    choice = json.loads((result.run_dir / "timing.json").read_text()).get("auto_choices", {})
    timing.attrs["auto"] = "+".join(sorted({c["trainer"] for c in choice.values()}))
    return timing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pfllib", required=True, help="a checkout of github.com/TsingZ0/PFLlib")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    system = Path(args.pfllib) / "system"
    if not (system / "flcore" / "clients" / "clientavg.py").exists():
        sys.exit(f"--pfllib: {args.pfllib} has no system/flcore/clients/clientavg.py; allowed: a PFLlib checkout")
    steps = CLIENTS * (PER_CLIENT // BATCH)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CFLPIPE_CACHE_DIR"] = str(Path(tmp) / "cache")  # auto measures afresh
        folder = Path(tmp)
        (folder / "work").mkdir()
        images = write_images(folder)
        best: dict[str, float] = {}
        auto = ""
        for _ in range(args.repeats):
            rounds = pfllib_rounds(system, folder / "work", args.rounds)
            best["PFLlib"] = min(best.get("PFLlib", np.inf), float(np.median(rounds[1:])))
            for trainer in (None, "sequential", "batched"):
                timing = cflpipe_rounds(folder, images, trainer, args.rounds)
                name = f"cflpipe {trainer or 'default (auto)'}"
                auto = timing.attrs["auto"] or auto
                per_round = float(np.median(timing["train_seconds"].iloc[1:-1]))
                best[name] = min(best.get(name, np.inf), per_round)
    print(f"{'side':28s} {'ms/round':>9s} {'µs/step':>8s} {'× PFLlib':>8s}")
    for name, seconds in best.items():
        print(f"{name:28s} {seconds * 1000:9.1f} {seconds / steps * 1e6:8.0f} {seconds / best['PFLlib']:8.2f}")
    print(f"(auto chose: {auto or 'sequential'}; {steps} SGD steps a round; torch {torch.__version__}, 1 thread)")


if __name__ == "__main__":
    main()
