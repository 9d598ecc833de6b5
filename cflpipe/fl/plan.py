"""A client's local work as data. A method describes what each sampled client does (start
vector, proximal anchors, trainable mask, budget, loss, step rule, companion vectors, which
network) and turns the trained result into its Update; the engine's trainer executes the plans,
one client at a time or all of a round's clients at once, and the method never knows which."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from cflpipe.fl.local import SGD, Anchor, LocalResult, StepRule, cross_entropy


@dataclass
class ClientPlan:
    """One client's local training.

    start:       flat vector of the network to train (the network is `space`: "model", the run's
                 model, or an auxiliary per-client network a method registered on the context)
    anchors:     proximal pulls (FedProx, Ditto, FedAC's μ and λ, FeSEM)
    trainable:   boolean mask of the entries that train (None: all)
    steps, lr:   local budget and step size (None: the run's training block, lr with its decay)
    momentum, weight_decay: None: the run's training block
    loss:        loss(network, x, y) -> scalar; cross-entropy by default
    rule:        the step rule (plain SGD with anchors and mask by default; FOMAMLStep, MoreauStep)
    companions:  extra per-client vectors the rule updates next to the weights (CGPFL's local model)
    inputs:      training inputs instead of the client's own x (e.g. features of a frozen encoder);
                 the targets stay the client's labels
    stream:      extra ints that select another seeded batch stream (e.g. evaluation fine-tuning);
                 plans of one client with the same stream see the same batches
    then:        a follow-up the client trains once this plan is done: then(trained) -> ClientPlan
                 (FCCA trains its cINN on the features of the encoder it has just trained). The
                 follow-ups of all clients of a round are trained together, as one more batch of
                 plans; their outcome is `Trained.then`. Not called when this plan diverged.
    into:        where the trainer writes the trained vector if this plan's training did not
                 diverge (e.g. the client's row of a server table that keeps every client's latest
                 model), which then is `Trained.vector`; None: a new tensor. It is written whatever
                 becomes of the client's other named plans, and cannot go with `then`. K-means
                 CFL's uploads at full participation then need no memory of their own (2,000 ×
                 221 KB, #17).
    """

    start: torch.Tensor
    anchors: tuple[Anchor, ...] = ()
    trainable: torch.Tensor | None = None
    steps: int | None = None
    lr: float | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    loss: Callable[..., torch.Tensor] = cross_entropy
    rule: StepRule = SGD
    companions: dict[str, torch.Tensor] = field(default_factory=dict)
    space: str = "model"
    inputs: torch.Tensor | None = None
    stream: tuple[int, ...] = ()
    then: Callable[["Trained"], "ClientPlan"] | None = None
    into: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.anchors = tuple(self.anchors)
        if self.into is not None and self.then is not None:
            # `into` is written when this plan is done, before its follow-up could diverge and
            # make the client's update one the engine skips.
            raise ValueError("ClientPlan: `into` cannot be combined with a follow-up (`then`)")


@dataclass
class Trained:
    """A plan's outcome: the trained vector, the companions after training, the loss record, and
    the outcome of the plan's follow-up (`ClientPlan.then`), if it had one."""

    vector: torch.Tensor
    result: LocalResult
    companions: dict[str, torch.Tensor] = field(default_factory=dict)
    then: "Trained | None" = None

    @property
    def diverged(self) -> bool:
        """This plan's or its follow-up's training diverged."""
        return self.result.diverged or (self.then is not None and self.then.diverged)


def trained_into(plan: ClientPlan, vector: torch.Tensor, result: LocalResult) -> torch.Tensor:
    """The trained vector as the plan asks for it: copied into `plan.into` unless training diverged
    (a diverged client's row keeps its last good value), else `vector` itself."""
    if plan.into is None or result.diverged:
        return vector
    return plan.into.copy_(vector)


# What a method's plan() returns: one plan, or several named plans of the same client (Ditto
# trains a global and a personal model); finish() receives the same shape of Trained.
Plans = ClientPlan | dict[str, ClientPlan]
Results = Trained | dict[str, Trained]
