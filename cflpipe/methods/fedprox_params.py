"""FedProx: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.fedprox`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.registry import HyperParams, declare


class FedProxParams(HyperParams):
    mu: float = Field(0.01, ge=0, description="proximal strength pulling local models to the global one")


declare("fedprox", FedProxParams, "cflpipe.methods.fedprox:FedProx",
        family="baseline")
