"""CGPFL: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods` read
them without importing `cflpipe.methods.cgpfl`, which implements it."""

from __future__ import annotations

from pydantic import Field, model_validator

from cflpipe.registry import Capabilities, HyperParams, declare


class CGPFLParams(HyperParams):
    clusters: int = Field(3, ge=1, description="K: number of generalized (context) models on the server")
    lam: float = Field(15.0, gt=0, description="λ: strength of the tie between a personalized model and its "
                       "local model (pFedMe's MNIST value)")
    inner_steps: int = Field(5, ge=1, description="gradient steps that approximately solve the personalized "
                             "(inner) problem on each mini-batch (pFedMe's K)")
    personal_lr: float = Field(0.05, gt=0, description="step size of the inner gradient steps; "
                               "personal_lr·lam must stay below 2")
    beta: float = Field(1.0, gt=0, le=2, description="β: server step Ω_k ← (1 − β)·Ω_k + β·(mean of its members' "
                        "local models); 1 = plain average")

    @model_validator(mode="after")
    def _inner_solver_converges(self) -> "CGPFLParams":
        if self.personal_lr * self.lam >= 2:
            raise ValueError(f"personal_lr·lam must be < 2 for the inner solver to converge, got "
                             f"{self.personal_lr}·{self.lam} = {self.personal_lr * self.lam:g}")
        return self


declare("cgpfl", CGPFLParams, "cflpipe.methods.cgpfl:CGPFL",
        Capabilities(clustered=True, personalized=True, k_param="clusters"), family="personalized",
        at_scale="two clients × parameters tables (the server's last w_i of every client, every client's θ_i): 4.9 GiB; 2.1 GiB with training.client_store: disk")
