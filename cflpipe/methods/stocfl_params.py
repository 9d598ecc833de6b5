"""StoCFL: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.stocfl`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.registry import Capabilities, HyperParams, declare


class StoCFLParams(HyperParams):
    tau: float = Field(0.3, ge=-1, le=1, description="τ: unite two clusters whose mean anchor movements have a "
                                                     "cosine similarity of at least this (the authors' default 0.3)")
    mu: float = Field(0.1, ge=0, description="μ: pull of a cluster model towards the global model while a client "
                                             "trains it (the authors' 0.1)")
    observe_epochs: float = Field(1.0, gt=0, description="epochs of local SGD from the anchor that measure a "
                                                         "client's movement ψ (the authors' 1)")


declare("stocfl", StoCFLParams, "cflpipe.methods.stocfl:StoCFL",
        Capabilities(clustered=True), family="clustered",
        at_scale="two clients × parameters tables (ψ_i and every client's model): 4.9 GiB; 1.1 GiB with training.client_store: disk")
