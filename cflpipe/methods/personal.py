"""Personal models kept on the clients (Local, Ditto, CGPFL): the shape those methods share."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from cflpipe.fl.method import Context


class PersonalModels:
    """Mixin, listed before the method's base class: each client keeps a model of its own in the
    engine's client store (table `personal_table`, starting from the run's initial model, so a
    client never sampled is evaluated with the untrained model) and is evaluated with it. The
    models stay on the clients: whatever a method sends is counted by its own updates."""

    personal_table: ClassVar[str] = "personal"
    ctx: Context  # set by Method

    def __init__(self, ctx: Context):
        super().__init__(ctx)  # type: ignore[call-arg]
        ctx.clients.add(self.personal_table, ctx.init)

    def eval_params(self, client: int) -> torch.Tensor:
        return self.ctx.clients.get(self.personal_table, client)

    def eval_models(self) -> tuple[list[torch.Tensor], np.ndarray]:
        models = self.ctx.clients[self.personal_table]
        return list(models), np.arange(len(models))
