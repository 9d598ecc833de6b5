"""The AWCFL and MCFL options every cluster-model method has (`intercluster.py` implements them,
`clustered.py` gives them to a method): their hyper-parameters and the variants' declarations,
torch-free."""

from __future__ import annotations

from pydantic import Field

from cflpipe.registry import HyperParams


class AWCFLParams(HyperParams):
    beta: float = Field(0.5, ge=0, le=1, description="AWCFL weight of the other clusters (paper's best: 0.5)")

    def premises_at(self, clusters: int | None) -> list[tuple[str, str]]:
        found = super().premises_at(clusters)
        if clusters is not None and awcfl_collapses(self.beta, clusters):
            # Eq. 2 at β = (K−1)/K: every cluster gets the mean of all (the run is marked collapsed)
            found.append(("beta", f"with {clusters} clusters, AWCFL's Eq. 2 at beta {self.beta:g} = (K-1)/K gives "
                                  f"every cluster the same model, the mean of all: one averaged model, not {clusters}"))
        return found


class MCFLParams(HyperParams):
    feature_samples: int = Field(100, ge=1, description="MCFL: inputs averaged into a feature mean (n)")


def awcfl_collapses(beta: float, clusters: int) -> bool:
    """Whether AWCFL's Eq. 2 gives all `clusters` cluster models one model, the mean of all:
    β = (K−1)/K (the paper's 0.5 with K = 2)."""
    return clusters > 1 and abs(beta - (clusters - 1) / clusters) < 1e-9


def cluster_options(name: str, awcfl: str = "{name}_awcfl", mcfl: str = "{name}_mcfl") -> tuple:
    """The AWCFL and MCFL variants every cluster-model method has (methods/clustered.py), ICFL aside."""
    return ((awcfl.format(name=name), AWCFLParams, "AWCFL inter-cluster aggregation (β)"),
            (mcfl.format(name=name), MCFLParams, "MCFL multi-model selection by feature means"))
