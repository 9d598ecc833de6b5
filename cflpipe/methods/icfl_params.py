"""ICFL: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.icfl`, which implements it."""

from __future__ import annotations

import math

from pydantic import Field

from cflpipe.registry import Capabilities, HyperParams, declare


class ICFLParams(HyperParams):
    eps1: float = Field(4.0, gt=math.e, description="ε₁ of the split bar α_t = 1 − (e/ε₁)^(t/ε₂): larger makes the "
                                                     "bar rise faster (FedRC's default 4; must exceed e)")
    alpha0: float = Field(0.85, gt=0, lt=1, description="α₀: the bar reaches it at round ε₂², "
                                                        "ε₂ = ln(1 − α₀)/(1 − ln ε₁) (FedRC's default 0.85)")


declare("icfl", ICFLParams, "cflpipe.methods.icfl:ICFL",
        Capabilities(clustered=True, pairs="the cosine similarity of every pair of clients in a cluster it tests for a split (all of them at first)", pair_bytes=16), family="clustered",
        at_scale="two clients × parameters tables and a cosine-similarity matrix of a cluster's members: server 1.9× its training, 5.1 GiB; 3.5 GiB with training.client_store: disk (the matrix and the members' updates it reads remain)")
