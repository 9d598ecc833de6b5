"""FeSEM: hyper-parameters, premises and declaration, torch-free so that `validate` and `cflpipe
methods` read them without importing `cflpipe.methods.fesem`, which implements it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from cflpipe.methods.intercluster_params import cluster_options
from cflpipe.registry import Capabilities, HyperParams, declare


class FeSEMParams(HyperParams):
    clusters: int = Field(2, ge=1, description="number of centers K (the paper reports FeSEM(2), (3) and (4))")
    lam: float = Field(0.1, ge=0, description="λ: weight of the distance term (λ/m)·‖ω − Ω‖² in the local "
                                              "objective (the paper gives no value; the authors' code uses 0.1)")
    init_restarts: int = Field(20, ge=1, le=1000, description="random k-means initializations of the centers; the "
                                                     "one with the lowest intra-cluster distance is kept (paper: 20)")
    init_iter: int = Field(100, ge=1, description="Lloyd iterations of each initialization run")
    loss_weight: Literal["eq7", "none"] = Field(
        "eq7", description="eq7: the local objective α_i·L_i + (λ/m)·Dist with α_i = n_i/n (eq. 7), optimized "
                           "as L_i + λ/(m·α_i)·Dist; none: L_i + (λ/m)·Dist (the pull ≈ 2λ/m, nearly off)")


def _fesem_premises(hp: FeSEMParams, training: Any, scenario: Any) -> list[tuple[str, str]]:
    skewed = any(step.kind in ("dirichlet", "pathological") for step in scenario.partition)
    if not (skewed and scenario.true_groups and training.local_steps is not None and training.local_steps < 20):
        return []
    return [("", f"its first clustering, of models one round from a common start, is the one it keeps (a client "
                 f"trains from its center, pulled to it, and stays nearest to it); under label skew inside the "
                 f"groups, 5 local steps left that clustering at ARI 0.15 on the robustness map's Dirichlet 1.0 "
                 f"cells, 20 at 0.91 (docs/robustness.md); this run has {training.local_steps}")]


declare("fesem", FeSEMParams, "cflpipe.methods.fesem:FeSEM",
        Capabilities(clustered=True, k_param="clusters"), variants=cluster_options("fesem"), premises=_fesem_premises,
        needs="a first round of local training long enough to tell the groups apart: it keeps its first clustering",
        family="seed", variant_family="modifier",
        at_scale="its first round gathers every client's model for k-means (the paper's initialization): 4.3 GiB")
