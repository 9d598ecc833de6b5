"""FCCA and its +Per, +Prox and +Per+Prox: hyper-parameters, premises and declaration, torch-free so
that `validate` and `cflpipe methods` read them without importing `cflpipe.methods.fcca`, which
implements it."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from cflpipe.registry import Capabilities, HyperParams, declare


class FCCAParams(HyperParams):
    later_defaults: ClassVar[dict[str, Any]] = {"kmeans_start": "fresh"}  # added 2026-12-02
    clusters: int = Field(5, ge=1, description="number of clusters M of the k-means on D (the paper's M; 5)")
    alpha: float = Field(1.0, ge=0, description="weight α of the UNKNOWN augmentation in the cINN loss (Eq. 3)")
    unknown: Literal["absent", "extra"] = Field(
        "absent", description="label of the augmentation samples z': a label the client does not have "
                              "(the paper's 𝒴/D_k) or one extra UNKNOWN label")
    personal: bool = Field(False, description="FCCA+Per: each client keeps its own classifier (FedPer style)")
    mu: float = Field(0.0, ge=0, description="FCCA+Prox: FedProx strength μ on the training of f and h (0: off)")
    flow_blocks: int = Field(2, ge=1, description="affine coupling blocks of the cINN (two coupling transforms each)")
    flow_hidden: int = Field(64, ge=1, description="hidden units of the cINN's coupling networks (two layers)")
    flow_clip: float = Field(10.0, gt=0, description="gradient-norm clipping of the cINN's steps")
    flow_clamp: float = Field(2.0, gt=0, description="bound on each coupling's |log scale| (FrEIA's soft "
                                                     "clamp; the paper states none)")
    flow_optimizer: Literal["adam", "sgd"] = Field(
        "adam", description="the cINN's optimizer: Adam as the cINN of Ardizzone et al. [8] is trained, or "
                            "the plain gradient step Algorithm 1 line 5 writes")
    flow_lr: float = Field(0.01, gt=0, description="the cINN's step size (the paper's η = 0.01; not the run's "
                                                    "lr, which is the classifier's SGD step)")
    flow_steps: int | None = Field(None, ge=1, description="the cINN's iterations a round as mini-batch steps "
                                                           "(the other reading of the paper's K; setting it drops "
                                                           "flow_epochs' default)")
    flow_epochs: float | None = Field(20.0, gt=0, description="the cINN's iterations a round as passes over the "
                                                             "client's data: the paper's K = 20 whatever the run's "
                                                             "local budget (both null: the run's local steps or "
                                                             "epochs)")
    flow_moments: Literal["reset", "keep"] = Field(
        "reset", description="Adam's moments of the cINN: afresh each round (a client's optimizer made each round) "
                             "or kept by the client across rounds, as one optimizer over the whole run")
    flow_restart: bool = Field(False, description="start each round's cINN from its initialization instead "
                                                  "of the client's last one")
    cosine: Literal["mean", "sample", "batch"] = Field(
        "mean", description="Eq. 4's cosine of two batches of reconstructions: cosine of their means (the "
                            "paper's E aᵀb = E a·E b), mean per-sample cosine, or cosine of the flattened batches")
    server_samples: int = Field(32, ge=1, description="Gaussian noise samples ε1 (and ε2) per label for the "
                                                      "server's reconstructions")
    kmeans_start: Literal["fresh", "last"] = Field(
        "fresh", description="where each round's k-means on D starts: afresh (k-means++; the paper's clustering "
                             "is 'without relying on previous clustering solutions', Sec. 1) or, a diagnostic "
                             "departure, from the centres of the last round's clusters in this round's D (one "
                             "Lloyd run; Sec. 3.3 states no initialization)")
    rows: Literal["centered", "raw"] = Field(
        "centered", description="what the k-means clusters: each client's row of D less its own mean (its "
                                "similarity profile; P scales whole rows by the client's confidence) or the raw rows")


    @model_validator(mode="before")
    @classmethod
    def _one_budget(cls, values):
        """The cINN's budget is flow_steps or flow_epochs: the one given replaces the other's
        default, and both given is a contradiction. `flow_steps: null` alone keeps the meaning it
        had when flow_steps was the default budget: the run's local steps or epochs."""
        if not isinstance(values, dict):
            return values
        steps, epochs = values.get("flow_steps"), values.get("flow_epochs")
        if steps is not None and epochs is not None:
            raise ValueError("flow_steps and flow_epochs: give one of them (the cINN's iterations as mini-batch "
                             "steps or as passes over the client's data)")
        if steps is not None or ("flow_steps" in values and "flow_epochs" not in values):
            return {**values, "flow_epochs": None}
        return values

    @model_validator(mode="after")
    def _kept_moments_need_adam(self):
        """Moments kept across rounds are Adam's, of a cINN that continues: refused where they
        would silently do nothing."""
        if self.flow_moments == "keep" and (self.flow_optimizer != "adam" or self.flow_restart):
            raise ValueError(f"flow_moments: 'keep' keeps Adam's moments of a cINN that continues across rounds; "
                             f"it needs flow_optimizer 'adam' (got {self.flow_optimizer!r}) and flow_restart false "
                             f"(got {str(self.flow_restart).lower()})")
        return self


class FCCAPerParams(FCCAParams):
    personal: bool = True


class FCCAProxParams(FCCAParams):
    mu: float = Field(0.01, gt=0, description="FedProx strength μ on the training of f and h")


class FCCAPerProxParams(FCCAProxParams):
    personal: bool = True


def fcca_options(name: str) -> tuple:
    """FCCA's +Per, +Prox and +Per+Prox (methods/fcca.py), for FCCA and a plugin's subclass of it."""
    return ((f"{name}_per", FCCAPerParams, "personal classifier (FedPer style)"),
            (f"{name}_prox", FCCAProxParams, "FedProx term μ"),
            (f"{name}_per_prox", FCCAPerProxParams, "personal classifier and FedProx term μ"))


# Fewer cINN iterations a round than this: FCCA's clustering is warned about (docs/robustness.md:
# at 5, D carried no group signal; at 10 and 20 it recovered the groups).
FCCA_MIN_FLOW_STEPS = 10


# Label-swap groups under stronger label skew than Dirichlet(this) are warned about: there D finds
# the groups only once the cINNs have learnt every held label's conditional, which they had not at
# the paper's settings (docs/fcca.md: 0.3 and 0.5 failed or fell short, 1.0 recovered).
FCCA_MIN_SWAP_ALPHA = 1.0


def _fcca_premises(hp: FCCAParams, training: Any, scenario: Any) -> list[tuple[str, str]]:
    found = []
    steps = hp.flow_steps if hp.flow_steps is not None else None if hp.flow_epochs is not None else training.local_steps
    if steps is not None and steps < FCCA_MIN_FLOW_STEPS:  # with epochs the count is the data's
        value = steps if hp.flow_steps is not None else f"null (flow_epochs null too: the run's {steps} local steps)"
        found.append(("flow_steps", f"{value}: FCCA clusters by what the cINN learns in these iterations a round; "
                                    f"with fewer than {FCCA_MIN_FLOW_STEPS} (the paper's K is 20) its similarity D "
                                    f"carried no group signal and FCCA clustered at random (docs/fcca.md); "
                                    f"leave the cINN's budget at its default, 20 passes (flow_epochs)"))
    swaps = any(step.kind == "label_swap" and step.ground_truth for step in scenario.group_steps())
    skews = [f"Dirichlet {step.alpha:g}" if step.kind == "dirichlet" else "pathological"
             for step in scenario.partition if step.kind == "pathological"
             or (step.kind == "dirichlet" and step.alpha < FCCA_MIN_SWAP_ALPHA)]
    if swaps and skews:
        found.append(("", f"label-swap groups under {skews[0]} label skew: FCCA's similarity D separates "
                          f"them only once each client's cINN has learnt its labels' conditionals (with ideal "
                          f"ones it did, ARI 1.00); at its paper's settings with Dirichlet 0.5 (our reading of its "
                          f"\"Dirichlet distribution\"), its cINNs had not: with K = 20 as mini-batch steps ARI 0.13 or "
                          f"less on LEAF Synthetic and MNIST-1D; as passes (the default) in part, and IFCA at the same "
                          f"budget recovered them better (docs/fcca.md, docs/reproduction.md)"))
    return found


declare("fcca", FCCAParams, "cflpipe.methods.fcca:FCCA",
        Capabilities(clustered=True, k_param="clusters", pairs="the similarity D of every pair of clients' cINNs (kept, and its rows centered for k-means); cflpipe writes it at each evaluation as a long table of every pair of the clients full evaluations read (training.full_eval_clients)", pair_bytes=24, pair_rows_bytes=100), variants=fcca_options("fcca"), premises=_fcca_premises,
        needs="cINNs that have learnt each held label's conditional: the paper's K = 20 as passes over the "
              "client's data (flow_epochs; with 5 mini-batch steps D carried no group signal); under label skew "
              "at its paper's settings even that recovered the label-exchange groups only in part (docs/fcca.md)",
        family="seed",
        at_scale="each round the server inverts every heard-from client's cINN on fresh noise (Algorithm 2, lines 2-3: "
                 "all clients' cINNs, a new batch of ε each round; about three quarters of its server time in a "
                 "profile at 10,000 clients) and runs k-means on D's rows: its heaviest round's server 1.3× that "
                 "round's training, growing with the clients heard from")
