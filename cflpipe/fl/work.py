"""Work items: one client plan's local training as self-contained, picklable data.

The run turns each plan into a WorkItem in its own process (the client's data, the number of
steps, the optimizer settings and the seeds of the batch stream all resolved there), and the
trainer trains items without the run's Context. A trainer that runs items in other processes
or on other machines (Ray, Dask) therefore needs only the items and the networks: it is a plugin
of the entry point group `cflpipe.trainers` (see `trainer_factory`).

What a remote trainer cannot use stays behind when an item is pickled: `into` (a server table
the in-process trainers write the trained vector into; the run copies a returned vector there)
and `source` (the whole training split the client's rows live in, which the batched trainer uses
to index every client's batches without copying). The tensors of an item are compacted on the
way out, so a client's rows do not drag the split they are views of along."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterator

import torch

from cflpipe.fl.local import Anchor, StepRule


@dataclass
class WorkItem:
    """One plan of one client, ready to train.

    network:        name of the parameter space (the run's model "model", or a method's network)
    start … companions: the plan's (see ClientPlan)
    x, y:           the inputs and targets it trains on (the client's rows, or the plan's inputs)
    steps, batch_size, lr, momentum, weight_decay: the resolved budget and optimizer settings
    stream_seed:    seed of the client's batch stream this round (batch_indices)
    dropout_seed:   seed of torch's global RNG before training, for dropout; None without dropout
    source:         (split inputs, split targets, offset) when x, y are the client's own rows
    into:           where an in-process trainer writes the trained vector (see ClientPlan.into)
    precision:      float32, tf32 or bf16: where its forward and backward passes run (local.precision_scope)
    """

    client: int
    network: str
    start: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    steps: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    stream_seed: int
    dropout_seed: int | None
    loss: Callable[..., torch.Tensor]
    rule: StepRule
    anchors: tuple[Anchor, ...] = ()
    trainable: torch.Tensor | None = None
    companions: dict[str, torch.Tensor] = field(default_factory=dict)
    source: tuple[torch.Tensor, torch.Tensor, int] | None = None
    into: torch.Tensor | None = None
    precision: str = "float32"

    def generator(self) -> torch.Generator:
        """The batch stream (and, where the network has dropout, torch's global seed for it)."""
        if self.dropout_seed is not None:
            seed_default_generators(self.dropout_seed)
        return torch.Generator().manual_seed(self.stream_seed)

    def __getstate__(self) -> dict[str, Any]:
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state["source"] = state["into"] = None
        return {key: _compact(value) for key, value in state.items()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def seed_default_generators(seed: int) -> None:
    """What `torch.manual_seed` does for the CPU and CUDA, the devices a run trains on, at a
    hundredth of its cost: torch.manual_seed also queues a seed for every device type not yet
    started (CUDA on a CPU run, XPU, MTIA), formatting a stack trace each time, about 0.1 ms on a
    CPU and more on the GPU machine measured, paid once per client with dropout. CUDA's
    generators are seeded only once CUDA has started, which it has in a CUDA run (the run puts
    its data on the device before any client trains); torch.manual_seed would queue the seed."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        for generator in torch.cuda.default_generators:
            generator.manual_seed(seed)


# While `pickled_together` runs (in this thread or task): each tensor's compact copy, by the
# tensor's id (the tensor is kept with it, so the id stays its own).
_SHARED: ContextVar[dict[int, tuple[torch.Tensor, torch.Tensor]] | None] = ContextVar("_SHARED", default=None)


@contextmanager
def pickled_together() -> Iterator[None]:
    """Pickling several items in one pickle.dumps: a tensor they share (a round's items mostly
    start from one global model) gets one compact copy, which pickle then writes once instead of
    once per item (for ResNet-18, 45 MB per item). Unpickled, the items share it again, as they
    did here; trainers only read an item's start."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def _compact(value: Any) -> Any:
    """A copy that owns only its own elements (a view pickles its whole storage)."""
    if isinstance(value, torch.Tensor):
        shared = _SHARED.get()
        if shared is None:
            return value.detach().clone()
        if id(value) not in shared:
            shared[id(value)] = (value, value.detach().clone())
        return shared[id(value)][1]
    if isinstance(value, Anchor):
        return replace(value, vector=_compact(value.vector), mask=_compact(value.mask))
    if isinstance(value, (tuple, list)):
        return type(value)(_compact(v) for v in value)
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items()}
    return value
