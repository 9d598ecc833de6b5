"""Per-FedAvg (Fallah, Mokhtari & Ozdaglar 2020, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach"), first-order (FO) variant.

The global model w is trained for the MAML objective (1/n)·Σ_i f_i(w − α∇f_i(w)): every local
step of a sampled client draws two independent mini-batches D and D' and does

    w̃ = w − α·∇f_i(w; D)            (inner, adaptation step)
    w ← w − β·∇f_i(w̃; D')           (outer step; FO drops the Hessian term of the meta-gradient)

and the server averages the returned models uniformly over the participating clients (the paper's
objective weights users equally). A client's personalized model is the global model after
`eval_steps` SGD steps of size α on its own training data (the paper evaluates after one step);
the Hessian-free (HF) variant is not implemented.

Step sizes. The paper uses small fixed steps for its MLP (α = β = 0.001 to our reading, not
verified here: the paper is not among the seed papers); the pFedMe authors' reimplementation
(CharlieDinh/pFedMe, userperavg.py) uses α = its shared learning rate 0.005 and β = 0.001. Those
values belong to the papers' learning-rate scale, not this benchmark's, so β defaults to the run's
`training.lr` (with its lr_decay): the outer step then plays the part FedAvg's learning rate
plays, and uses the run's momentum and weight decay like every method's local optimizer (set
`training: {momentum: 0}` on the method entry for the paper's plain SGD). α, the inner and
fine-tuning step (plain SGD, as in the paper), defaults to 0.01, the order of the papers' inner
steps: with α equal to the benchmark's lr (0.05) the first-order approximation broke down on digits
(Dirichlet 0.1, 20 clients: personalized accuracy 0.57–0.76 against 0.92–0.97 with α = 0.01).

The local step is the step rule `FOMAMLStep` of fl/local.py in the shared local loop: each step
takes two consecutive index batches (D, D') of the client's one stream of epoch permutations.
"""

from __future__ import annotations

import numpy as np
import torch

from cflpipe.fl.local import FOMAMLStep
from cflpipe.fl.method import ClientView, Context, Payload, Placement, Update, stack_updates
from cflpipe.fl.params import weighted_average
from cflpipe.fl.plan import ClientPlan
from cflpipe.fl.predictors import Models
from cflpipe.methods.fedavg import FedAvg

# Batch stream of the evaluation fine-tuning (training uses the client's default stream).
_EVAL_STREAM = 2  # evaluation-time fine-tuning draws apart from training


class PerFedAvg(FedAvg):
    """Per-FedAvg (FO): MAML-style global model, personalized by one local SGD step at evaluation."""

    def alpha(self) -> float:
        return self.ctx.lr() if self.hp.alpha is None else self.hp.alpha

    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan, None]:
        alpha = view.lr() if view.hp.alpha is None else view.hp.alpha
        beta = view.lr() if view.hp.beta is None else view.hp.beta
        return ClientPlan(payload.tensors["model"], lr=beta, rule=FOMAMLStep(alpha)), None

    def aggregate(self, updates: dict[int, Update]) -> None:
        if updates:
            _, vectors, _ = stack_updates(updates)
            ones = torch.ones(vectors.shape[0], dtype=vectors.dtype, device=vectors.device)
            self.global_model = weighted_average(vectors, ones)

    # --- evaluation: each client fine-tunes the global model on its own training data
    def fine_tuning(self) -> ClientPlan:
        """eval_steps plain SGD steps of size α (no momentum, no weight decay, as in the paper)
        on a batch stream of its own, so evaluating never moves the training streams."""
        return ClientPlan(self.global_model, steps=self.hp.eval_steps, lr=self.alpha(), momentum=0.0,
                          weight_decay=0.0, stream=(_EVAL_STREAM,))

    newcomer_rule = ("receives the global model and fine-tunes it as every client is evaluated (eval_steps SGD steps "
                     "of size α on its own training data), served that model")

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        shared = np.zeros(n, dtype=np.int64)
        placement = self.served(newcomers, shared, [self.global_model], shared)  # the global model, sent
        if self.hp.eval_steps == 0:
            return placement
        plan = self.fine_tuning()  # evaluation's fine-tuning, as predictor() does it for every client
        tuned = newcomers.run({c: plan for c in range(n)})
        return Placement(shared, Models.own([tuned[c].vector for c in range(n)]))

    def predictor(self, clients: np.ndarray | None = None) -> Models:
        m = self.ctx.num_clients
        if self.hp.eval_steps == 0:
            return Models.shared(self.global_model, m)
        plan = self.fine_tuning()
        tuned = self.ctx.run({int(client): plan for client in (range(m) if clients is None else clients)})
        # A model per client, so a client's `model` is its own id; in a sampled evaluation the
        # others' entries (the global model) are never read.
        return Models.own([tuned[c].vector if c in tuned else self.global_model for c in range(m)])
