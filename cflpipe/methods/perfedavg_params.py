"""Per-FedAvg: hyper-parameters and declaration, torch-free so that `validate` and `cflpipe methods`
read them without importing `cflpipe.methods.perfedavg`, which implements it."""

from __future__ import annotations

from pydantic import Field

from cflpipe.registry import Capabilities, HyperParams, declare


class PerFedAvgParams(HyperParams):
    alpha: float | None = Field(0.01, gt=0, description="α: inner (adaptation) step size, also the step of the "
                                "fine-tuning before evaluation; null: the run's training lr")
    beta: float | None = Field(None, gt=0, description="β: outer (meta) step size of the local updates, which use the "
                               "run's momentum and weight decay; null (default): the run's training lr")
    eval_steps: int = Field(1, ge=0, description="SGD steps (size α) on the client's training data from the "
                            "global model that give its personalized model (the paper: 1; 0 = the global model)")


declare("perfedavg", PerFedAvgParams, "cflpipe.methods.perfedavg:PerFedAvg",
        Capabilities(personalized=True), family="personalized")
