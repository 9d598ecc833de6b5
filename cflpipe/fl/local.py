"""Local training on in-memory tensors: index batches, one local loop whose loss and step rule
are arguments, proximal anchors and trainable masks. It does not know which method calls it;
methods differ in the plan they hand the trainer (fl/plan.py), not in loops of their own.

A step rule's arithmetic is written once for both trainers: `weights` is either one flat
parameter vector (the sequential trainer, where the model's parameters are views into it) or a
(clients × P) matrix (the batched trainer). Python-scalar factors and (P,) or (clients × P)
masks broadcast the same way in both, and the in-place operations are the same ones the
sequential path always used, so it stays bit for bit what it was."""

from __future__ import annotations

from contextlib import contextmanager

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from cflpipe.fl.params import ParamSpace


@dataclass(frozen=True)
class Anchor:
    """Adds strength · mask ⊙ (w − vector) to the gradient, i.e. the proximal term
    (strength/2)·‖mask ⊙ (w − vector)‖² of FedProx, Ditto, FedAC's μ and λ pulls, FeSEM."""

    vector: torch.Tensor
    strength: float
    mask: torch.Tensor | None = None


@dataclass(frozen=True)
class LocalResult:
    loss: float  # mean training loss over the local steps (nan/inf when it diverged)
    steps: int
    samples: int

    @property
    def diverged(self) -> bool:
        return not math.isfinite(self.loss)


def steps_for(n: int, batch_size: int, local_steps: int | None, local_epochs: float | None) -> int:
    if local_steps is not None:
        return local_steps
    assert local_epochs is not None
    return max(1, math.ceil(local_epochs * n / min(batch_size, n)))


def batch_indices(n: int, batch_size: int, steps: int, generator: torch.Generator) -> torch.Tensor:
    """(steps × batch) sample indices: consecutive passes over fresh permutations, so every
    sample is seen once per epoch. Drawn on the CPU so the stream is the same on every device."""
    batch = min(batch_size, n)
    passes = math.ceil(steps * batch / n)
    order = torch.cat([torch.randperm(n, generator=generator) for _ in range(passes)])
    return order[: steps * batch].view(steps, batch)


def apply_step(weights: torch.Tensor, direction: torch.Tensor, lr: float, *, weight_decay: float = 0.0,
               momentum: float = 0.0, velocity: torch.Tensor | None = None) -> None:
    """PyTorch SGD's update, in place on flat vectors: d = direction + weight_decay·w,
    v ← momentum·v + d (when a velocity buffer is given), w ← w − lr·v. `direction` is modified."""
    if weight_decay:
        direction.add_(weights, alpha=weight_decay)
    if velocity is not None:
        velocity.mul_(momentum).add_(direction)
        direction = velocity
    weights.add_(direction, alpha=-lr)


Gradient = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def cross_entropy(forward: Callable[..., torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The default local objective: mean cross-entropy of the network's logits.

    A loss takes the network as a callable (the module itself, or a functional call of it under
    vmap), a batch of inputs and a batch of targets, and returns a scalar."""
    return F.cross_entropy(forward(x), y)


@dataclass(frozen=True)
class StepConfig:
    """The optimizer settings of one local loop (shared by every client of a batched group)."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    # (vector, strength) pairs: strength is a float or a float mask (P,) / (clients × P).
    pulls: tuple[tuple[torch.Tensor, Any], ...] = ()
    keep: torch.Tensor | None = None  # trainable mask as float multipliers


@dataclass
class LoopState:
    """What a rule carries from step to step: the momentum buffer and the companion vectors
    (extra per-client vectors a rule updates next to the weights, e.g. CGPFL's local model)."""

    velocity: torch.Tensor | None
    companions: dict[str, torch.Tensor]
    # A rule's own scratch for this loop (Adam's moments and step count), fresh every loop.
    scratch: dict[str, Any] = field(default_factory=dict)


class StepRule:
    """How one local step turns gradients into new weights. `step` receives the weights (updated
    in place), this step's `batches_per_step` batches, a gradient function
    gradient(weights, x, y) -> (loss, grad) and returns the step's loss for the running mean."""

    batches_per_step = 1
    takes_anchors = False  # whether the rule applies the plan's anchors and trainable mask

    def velocity_like(self, weights: torch.Tensor, companions: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.zeros_like(weights)

    def step(self, weights: torch.Tensor, batches: list[tuple[torch.Tensor, torch.Tensor]], gradient: Gradient,
             state: LoopState, config: StepConfig) -> torch.Tensor:
        raise NotImplementedError


@dataclass(frozen=True)
class SGDStep(StepRule):
    """PyTorch SGD on the loss plus the anchors' proximal terms, masked by the trainable mask.
    With `clip`, the loss gradient's norm is first clipped to at most `clip` (per client), as
    torch.nn.utils.clip_grad_norm_ does before the optimizer step."""

    clip: float | None = None
    takes_anchors = True

    def step(self, weights, batches, gradient, state, config):
        (x, y), = batches
        loss, grad = gradient(weights, x, y)
        with torch.no_grad():
            if self.clip is not None:
                clip_rows(grad, self.clip)
            if config.weight_decay:
                grad.add_(weights, alpha=config.weight_decay)
            for vector, strength in config.pulls:  # += s·(w − v), without a temporary the size of w
                if isinstance(strength, float):
                    grad.add_(weights, alpha=strength).sub_(vector, alpha=strength)
                else:
                    grad.addcmul_(weights, strength).addcmul_(vector, strength, value=-1)
            if config.keep is not None:
                grad.mul_(config.keep)
            apply_step(weights, grad, config.lr, momentum=config.momentum, velocity=state.velocity)
        return loss


SGD = SGDStep()


def clip_rows(grad: torch.Tensor, clip: float) -> None:
    """Scale each client's gradient (a vector, or each row of a matrix) to norm ≤ clip, in place,
    as torch.nn.utils.clip_grad_norm_ does before an optimizer step."""
    norm = torch.linalg.vector_norm(grad, dim=-1, keepdim=True)
    grad.mul_((clip / (norm + 1e-6)).clamp_(max=1.0))


@dataclass(frozen=True)
class AdamStep(StepRule):
    """Adam (Kingma & Ba; torch.optim.Adam's update without weight decay or amsgrad) on the loss,
    with the gradient norm first clipped to `clip` (per client) when given. The moments start
    at zero in every local loop, as a client's optimizer made afresh each round does; with
    `kept` they are the plan's companions (`KEPT_MOMENTS`: first and second moments, and the
    steps taken, one entry per client), updated in place, so a client that keeps them continues
    one optimizer across rounds as torch.optim.Adam would. The run's momentum and weight decay
    do not apply; a plan with this rule has no anchors or mask."""

    clip: float | None = None
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    kept: bool = False

    def step(self, weights, batches, gradient, state, config):
        (x, y), = batches
        loss, grad = gradient(weights, x, y)
        with torch.no_grad():
            if self.clip is not None:
                clip_rows(grad, self.clip)
            if self.kept:
                self._kept_step(weights, grad, state.companions, config.lr)
                return loss
            scratch = state.scratch
            if not scratch:
                scratch.update(first=torch.zeros_like(weights), second=torch.zeros_like(weights), t=0)
            scratch["t"] += 1
            b1, b2, t = self.betas[0], self.betas[1], scratch["t"]
            scratch["first"].mul_(b1).add_(grad, alpha=1 - b1)
            scratch["second"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
            denominator = (scratch["second"].sqrt() / math.sqrt(1 - b2 ** t)).add_(self.eps)
            weights.addcdiv_(scratch["first"], denominator, value=-config.lr / (1 - b1 ** t))
        return loss

    def _kept_step(self, weights, grad, kept, lr):
        """The same update with the moments and step count of the companions: the count is a
        tensor (one entry per client of a batched group), so the bias corrections are too."""
        first, second, t = (kept[name] for name in KEPT_MOMENTS)
        b1, b2 = self.betas
        t.add_(1)
        first.mul_(b1).add_(grad, alpha=1 - b1)
        second.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        denominator = (second.sqrt() / (1 - b2 ** t).sqrt()).add_(self.eps)
        weights.sub_(first / denominator * (lr / (1 - b1 ** t)))


# The companions of AdamStep(kept=True): first and second moments (like the weights) and the
# steps taken (one entry per client).
KEPT_MOMENTS = ("adam_first", "adam_second", "adam_steps")


@dataclass(frozen=True)
class FOMAMLStep(StepRule):
    """First-order MAML (Per-FedAvg FO): on two batches D, D' of one stream,
    w̃ = w − α∇f(w; D), then w ← w − lr·∇f(w̃; D') with the run's momentum and weight decay
    (the Hessian term of the meta-gradient dropped). The loss is f(w̃; D')."""

    alpha: float
    batches_per_step = 2

    def step(self, weights, batches, gradient, state, config):
        (xi, yi), (xo, yo) = batches
        start = weights.detach().clone()
        _, grad = gradient(weights, xi, yi)
        with torch.no_grad():
            weights.add_(grad, alpha=-self.alpha)  # w̃ = w − α∇f(w; D)
        loss, grad = gradient(weights, xo, yo)  # ∇f(w̃; D'): the FO meta-gradient
        with torch.no_grad():
            weights.copy_(start)
            apply_step(weights, grad, config.lr, weight_decay=config.weight_decay, momentum=config.momentum,
                       velocity=state.velocity)
        return loss


@dataclass(frozen=True)
class MoreauStep(StepRule):
    """pFedMe's bi-level step (CGPFL): the weights are the personalized model θ; the companion
    `local` is the local model w. On one batch θ ≈ argmin ℓ(θ) + (λ/2)‖θ − w‖² by `inner_steps`
    gradient steps of size `personal_lr`, then w ← w − lr·λ(w − θ) (the Moreau envelope's
    gradient) with the run's momentum and weight decay. The loss is the last inner step's."""

    lam: float
    inner_steps: int
    personal_lr: float
    companion: str = "local"

    def velocity_like(self, weights, companions):
        return torch.zeros_like(companions[self.companion])

    def step(self, weights, batches, gradient, state, config):
        (x, y), = batches
        w = state.companions[self.companion]
        for _ in range(self.inner_steps):
            loss, grad = gradient(weights, x, y)
            with torch.no_grad():
                grad.add_(weights - w, alpha=self.lam)
                weights.add_(grad, alpha=-self.personal_lr)
        with torch.no_grad():
            envelope = (w - weights).mul_(self.lam)  # ∇F_i(w) = λ(w − θ(w))
            apply_step(w, envelope, config.lr, weight_decay=config.weight_decay, momentum=config.momentum,
                       velocity=state.velocity)
        return loss


def step_config(weights: torch.Tensor, lr: float, momentum: float, weight_decay: float,
                anchors: tuple[Anchor, ...] | list[Anchor], trainable: torch.Tensor | None) -> StepConfig:
    # Masks become float multipliers once per loop, not once per step.
    pulls = tuple((a.vector, float(a.strength) if a.mask is None else a.strength * a.mask.to(weights.dtype))
                  for a in anchors if a.strength != 0)
    keep = None if trainable is None else trainable.to(weights.dtype)
    return StepConfig(lr, momentum, weight_decay, pulls, keep)


@contextmanager
def precision_scope(precision: str, device_type: str) -> Iterator[None]:
    """Where a local step's forward and backward run: float32 as is (bit for bit); bf16 under
    torch.autocast(bfloat16) on the step's device; tf32 with CUDA's matmuls and convolutions in
    TensorFloat-32 (the flags put back afterwards; cuDNN's is on by PyTorch's default anyway;
    nothing changes on a CPU). Neither of the two
    is bit-identical to float32; both are reproducible on one machine."""
    if precision == "bf16":
        with torch.autocast(device_type, dtype=torch.bfloat16):
            yield
    elif precision == "tf32" and device_type == "cuda":
        before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    else:
        yield


def run_loop(weights: torch.Tensor, batches: torch.Tensor, fetch: Callable[[torch.Tensor], tuple],
             gradient: Gradient, rule: StepRule, config: StepConfig, companions: dict[str, torch.Tensor],
             total: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
    """The local loop shared by both trainers: `batches` is (steps × batches_per_step × …) of
    index batches, `fetch` turns one into (x, y). Returns the summed step losses in `total`.

    `active` (steps × clients, batched only) marks the steps each client takes: a client with
    fewer steps than the group (local_epochs over unequal data) has the rest computed and undone,
    its weights and companions put back and its loss not counted, so it ends where its own
    steps leave it. Its steps come first, so a finished client never steps again."""
    if not rule.takes_anchors and (config.pulls or config.keep is not None):
        raise ValueError(f"{type(rule).__name__} does not apply anchors or a trainable mask; "
                         f"a plan with this rule must have neither")
    state = LoopState(rule.velocity_like(weights, companions) if config.momentum else None, companions)
    for s, step_batches in enumerate(batches):
        done = None if active is None or bool(active[s].all()) else ~active[s]
        if done is not None:
            kept = weights[done].clone(), {k: v[done].clone() for k, v in companions.items()}
        loss = rule.step(weights, [fetch(b) for b in step_batches], gradient, state, config)
        with torch.no_grad():
            if done is None:
                total += loss.detach()
            else:
                weights[done] = kept[0]
                for k, v in kept[1].items():
                    companions[k][done] = v
                total += torch.where(done, 0.0, loss.detach())
    return total


def sgd(space: ParamSpace, x: torch.Tensor, y: torch.Tensor, *, steps: int, batch_size: int,
        lr: float, generator: torch.Generator, momentum: float = 0.0, weight_decay: float = 0.0,
        anchors: tuple[Anchor, ...] | list[Anchor] = (), trainable: torch.Tensor | None = None,
        loss: Callable[..., torch.Tensor] = cross_entropy, rule: StepRule = SGD,
        companions: dict[str, torch.Tensor] | None = None, precision: str = "float32") -> LocalResult:
    """Train the model currently loaded in `space` in place (read the result with space.read()).

    `loss(model, x, y)` is the local objective (cross-entropy by default) and `rule` the step
    rule (plain SGD with anchors and mask by default); `companions` are extra vectors the rule
    updates in place (their starting values must be copies the caller may lose)."""
    n = x.shape[0]
    if n == 0 or steps == 0:
        return LocalResult(0.0, 0, 0)
    flat, grad, model = space.flat, space.grad, space.model
    per_step = rule.batches_per_step
    batches = batch_indices(n, batch_size, steps * per_step, generator).to(x.device)
    batches = batches.view(steps, per_step, batches.shape[1])
    config = step_config(flat, lr, momentum, weight_decay, anchors, trainable)

    def gradient(weights: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor):
        grad.zero_()
        with precision_scope(precision, flat.device.type):
            value = loss(model, xb, yb)
            value.backward()
        return value.detach(), grad

    total = torch.zeros((), dtype=flat.dtype, device=flat.device)
    model.train()
    run_loop(flat, batches, lambda b: (x[b], y[b]), gradient, rule, config, companions or {}, total)
    return LocalResult(float(total) / steps, steps, steps * per_step * batches.shape[2])


@torch.no_grad()
def predict(space: ParamSpace, x: torch.Tensor, y: torch.Tensor, chunk: int = 8192
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted labels and per-sample losses of the loaded model, in large batches."""
    space.model.eval()
    preds, losses = [], []
    for start in range(0, x.shape[0], chunk):
        logits = space.model(x[start:start + chunk])
        preds.append(logits.argmax(dim=1))
        losses.append(F.cross_entropy(logits, y[start:start + chunk], reduction="none"))
    if not preds:
        return torch.empty(0, dtype=torch.long, device=x.device), torch.empty(0, device=x.device)
    return torch.cat(preds), torch.cat(losses)
