"""Oracle: FedAvg inside the ground-truth groups."""

from __future__ import annotations

import numpy as np

from cflpipe.errors import SpecError
from cflpipe.fl.method import Context, Placement
from cflpipe.methods.clustered import ClusterModels


class Oracle(ClusterModels):
    """Oracle: FedAvg within the scenario's ground-truth groups (the reference for cluster recovery)."""


    def __init__(self, ctx):
        if not ctx.data.has_groups:
            raise SpecError(f"methods.{ctx.method}: oracle needs ground-truth groups, but scenario "
                            f"{ctx.scenario} has none; add a rotation, label_swap or flip partition step")
        super().__init__(ctx, ctx.data.num_groups, ctx.data.groups)

    newcomer_rule = "served its true group's model (Oracle is told the groups)"

    def round_start(self, sampled: np.ndarray) -> None:
        # Told the groups as they are now: a client that moves (scenario drift) trains with its
        # new group from the round it moves.
        super().round_start(sampled)
        self.clusters[:] = self.ctx.data.groups

    def place(self, newcomers: Context) -> Placement:
        """A group no participant holds (all of its clients new) has no model: its new clients are
        served the mean of the groups' models, in no cluster."""
        groups = newcomers.data.groups
        known = groups < len(self.centers)
        clusters = np.where(known, groups, -1)
        models = [*self.centers, self.centers.mean(0)]
        return self.served(newcomers, clusters, models, np.where(known, groups, len(self.centers)))
