"""Personal models kept on the clients (Local, Ditto, CGPFL): the shape those methods share."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from cflpipe.fl.method import Context
from cflpipe.fl.predictors import Models


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

    def predictor(self, clients: np.ndarray | None = None) -> Models:
        return Models.own(self.ctx.clients[self.personal_table])
