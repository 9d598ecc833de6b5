"""Oracle: FedAvg inside the ground-truth groups."""

from __future__ import annotations

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

    def place(self, newcomers: Context) -> Placement:
        groups = newcomers.data.groups
        return self.served(newcomers, groups, list(self.centers), groups)
