"""FedAvg: its declaration, torch-free so that `validate` and `cflpipe methods` read it without
importing `cflpipe.methods.fedavg`, which implements it."""

from __future__ import annotations

from cflpipe.registry import HyperParams, declare


declare("fedavg", HyperParams, "cflpipe.methods.fedavg:FedAvg",
        family="baseline")
