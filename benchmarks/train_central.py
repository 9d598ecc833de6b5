"""Central training of one or more models on a dataset's whole training split (no federation):
whether a model learns at all at a method's step size before its federated runs are read (#68
item 3: FCCA's 11-layer MLP, `mlp11`, against the 2NN on MNIST-1D at the paper's η = 0.01).

    python benchmarks/train_central.py --dataset mnist1d --models mlp mlp11 [--lr 0.01]
        [--batch 64] [--epochs 60]

prints each model's test accuracy after epochs 1, 5, 10, 20, 40, … (plain SGD, seeded).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from cflpipe.data import load_dataset
from cflpipe.models import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist1d")
    parser.add_argument("--data-dir", default="resources/datasets")
    parser.add_argument("--models", nargs="+", default=["mlp", "mlp11"])
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_dataset(args.dataset, None, args.data_dir)
    x = torch.as_tensor(np.asarray(data.x_train), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(data.y_train)).long()
    x_test = torch.as_tensor(np.asarray(data.x_test), dtype=torch.float32)
    y_test = torch.as_tensor(np.asarray(data.y_test)).long()
    shown = {1, 5, 10, 20, args.epochs} | set(range(40, args.epochs + 1, 20))
    for name in args.models:
        torch.manual_seed(0)
        model = build_model(name, tuple(x.shape[1:]), int(data.num_classes))
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        order = torch.Generator().manual_seed(0)
        for epoch in range(1, args.epochs + 1):
            permutation = torch.randperm(len(x), generator=order)
            for start in range(0, len(x), args.batch):
                batch = permutation[start:start + args.batch]
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
                optimizer.step()
            if epoch in shown:
                model.eval()
                with torch.no_grad():
                    accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
                model.train()
                print(f"{name:8s} epoch {epoch:4d}  test accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
