"""FedTSDP: hyper-parameters, premises, limits and declaration, torch-free so that `validate` and
`cflpipe methods` read them without importing `cflpipe.methods.fedtsdp`, which implements it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from cflpipe.registry import Capabilities, HyperParams, declare
from cflpipe.spec import model_layers


class FedTSDPParams(HyperParams):
    hopkins_threshold: float = Field(0.65, gt=0, lt=1, description="h_th: cluster only when H exceeds it")
    hopkins_fraction: float = Field(0.1, gt=0, le=1, description="m̃/m: share of the round's clients "
                                                                  "sampled for the Hopkins statistic")
    hopkins_min_samples: int = Field(1, ge=1, description="floor on m̃ (capped at m); 1: the paper's m̃ = 0.1·m "
                                                          "alone (a floor of 5 lowers the statistic's spread and "
                                                          "with it how soon the gate first opens)")
    hopkins_draws: int = Field(1, ge=1, description="H of Eq. 6 as the mean of this many draws of its random "
                                                     "points on the round's outputs (1: one draw a round, the paper's)")
    public_batch: int = Field(50, ge=2, description="B: public samples drawn per round")
    radii: Literal["relative", "absolute"] = Field(
        "relative", description="relative: ε2 multiplies the round's median distance from a client to its nearest "
                                "neighbour in its stage-1 group (scale-free); absolute: it is a distance (the paper's)")
    eps_js: float = Field(0.15, gt=0, description="ε1: DBSCAN radius on the JS divergence of outputs (JS lies in "
                                                  "[0, ln 2] whatever the model: the paper's value)")
    eps_weights: float | None = Field(None, gt=0, description="ε2: DBSCAN radius on the L2 distance of model "
                                                              "weights (default: 2 relative; 3.5 absolute, the "
                                                              "paper's CNN on CIFAR)")
    min_pts: int = Field(2, ge=1, description="DBSCAN min_pts of both stages")
    noise: Literal["cluster", "singletons", "previous"] = Field(
        "cluster", description="DBSCAN's noise points (the paper says nothing of them): one cluster of a stage's "
                               "noise (DBSCAN's label -1 taken as a group), each its own cluster, or each keeps "
                               "the cluster it was in")
    dampening: float = Field(0.98, gt=0, le=1, description="ψ: shared-layer dampening ratio")
    dampening_schedule: Literal["constant", "power"] = Field(
        "constant", description="L_s ← L_s·ψ at each clustering (constant) or L_s·ψ^r (power)")
    shared_layers: int | Literal["body"] | None = Field(
        None, description="initial number of shared layers (default: all, as the paper's Fig. 11; "
                          "body: all but the last, FedPer's split)")

    @field_validator("shared_layers")
    @classmethod
    def _non_negative(cls, value):
        if isinstance(value, int) and value < 0:
            raise ValueError("must be >= 0 (a number of layers), or 'body'")
        return value
    layer_rounding: Literal["round", "floor", "ceil"] = Field(
        "round", description="how the real-valued L_s becomes a number of layers")


# FedTSDP's clustering signal is one round's local drift away from a shared model: below this
# many local steps its Hopkins gate rarely opened on the robustness map (docs/robustness.md).
FEDTSDP_MIN_LOCAL_STEPS = 20


def _fedtsdp_premises(hp: FedTSDPParams, training: Any, scenario: Any) -> list[tuple[str, str]]:
    found = []
    if training.clients_per_round < scenario.participants:
        found.append(("", f"its Hopkins gate and clustering read only the round's {training.clients_per_round} of "
                          f"{scenario.participants} clients (the paper samples all of them); with half of them it "
                          f"recovered the groups in none of the robustness map's 12 cells (docs/robustness.md)"))
    if training.local_steps is not None and training.local_steps < FEDTSDP_MIN_LOCAL_STEPS:
        found.append(("", f"it clusters by how far one round's local training moves each client's outputs from the "
                          f"shared model (the paper trains 2 local epochs); with all clients every round it recovered "
                          f"the groups in 1 of the robustness map's 6 cells at 5 local steps (where its gate opened, "
                          f"DBSCAN kept one cluster), in 3 at 20 (docs/robustness.md); this run has "
                          f"{training.local_steps}"))
    return found


def _fedtsdp_limits(hp: FedTSDPParams, training: Any, scenario: Any) -> list[tuple[str, str]]:
    layers = model_layers(training.model)  # a plugin's network: checked when the run builds it
    if layers is not None and isinstance(hp.shared_layers, int) and hp.shared_layers > layers:
        return [("shared_layers", f"must be <= {layers} (the layers of model {training.model}), "
                                  f"got {hp.shared_layers}")]
    return []


declare("fedtsdp", FedTSDPParams, "cflpipe.methods.fedtsdp:FedTSDP",
        Capabilities(clustered=True, personalized=True, needs_public=True, pairs="the Jensen–Shannon divergence and the weight distance of every pair of a round's clients (two-stage DBSCAN; of every client in the paper's full participation)", pair_bytes=24, pairs_round=True), premises=_fedtsdp_premises,
        limits=_fedtsdp_limits,
        needs="every client every round and the paper's local budget (2 epochs; 20 steps or more): its gate reads "
              "one round's drift of the round's clients' outputs",
        family="seed",
        at_scale="its server work is the round's own (0.3 s at any population, 1.2× its training); every client's model: 3.1 GiB; 2.6 GiB with training.client_store: disk")
