"""The built-in methods, declared: each one's hyper-parameters (a pydantic model, validated up
front), capabilities, variants, the round its clustering may start in, and the class that
implements it; what a method is, in a sentence, is the first paragraph of its class docstring,
read from its source without importing it (`registry.class_summary`). Nothing here imports torch, so validating a spec (`cflpipe validate`, the
workflow's first step) and listing methods cost no torch import; a method's module is imported
when a run needs its class, which is bound to its declaration as it is defined
(`registry.bind_declared`): a built-in is named here and nowhere else.

Each parameter model stays next to its method in spirit: the method's module docstring names
the paper and every reading; the descriptions here say what each value does and where its
default comes from. A new built-in method adds its parameters and one `declare` call here."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from cflpipe.registry import Capabilities, HyperParams, declare
from cflpipe.spec import model_layers


# --- methods/fedprox.py

class FedProxParams(HyperParams):
    mu: float = Field(0.01, ge=0, description="proximal strength pulling local models to the global one")


# --- methods/perfedavg.py

class PerFedAvgParams(HyperParams):
    alpha: float | None = Field(0.01, gt=0, description="α: inner (adaptation) step size, also the step of the "
                                "fine-tuning before evaluation; null: the run's training lr")
    beta: float | None = Field(None, gt=0, description="β: outer (meta) step size of the local updates, which use the "
                               "run's momentum and weight decay; null (default): the run's training lr")
    eval_steps: int = Field(1, ge=0, description="SGD steps (size α) on the client's training data from the "
                            "global model that give its personalized model (the paper: 1; 0 = the global model)")


# --- methods/ditto.py

class DittoParams(HyperParams):
    lam: float = Field(1.0, ge=0, description="λ: strength of the pull of each personal model towards the "
                       "round's global model (the authors' run scripts use 1; 0 = purely local personal models)")
    personal_steps: int | None = Field(None, ge=1, description="local SGD steps on the personal model per round "
                                       "(default: the same budget as the global model's local training)")


# --- methods/cgpfl.py

class CGPFLParams(HyperParams):
    clusters: int = Field(3, ge=1, description="K: number of generalized (context) models on the server")
    lam: float = Field(15.0, gt=0, description="λ: strength of the tie between a personalized model and its "
                       "local model (pFedMe's MNIST value)")
    inner_steps: int = Field(5, ge=1, description="gradient steps that approximately solve the personalized "
                             "(inner) problem on each mini-batch (pFedMe's K)")
    personal_lr: float = Field(0.05, gt=0, description="step size of the inner gradient steps; "
                               "personal_lr·lam must stay below 2")
    beta: float = Field(1.0, gt=0, le=2, description="β: server step Ω_k ← (1 − β)·Ω_k + β·(mean of its members' "
                        "local models); 1 = plain average")

    @model_validator(mode="after")
    def _inner_solver_converges(self) -> "CGPFLParams":
        if self.personal_lr * self.lam >= 2:
            raise ValueError(f"personal_lr·lam must be < 2 for the inner solver to converge, got "
                             f"{self.personal_lr}·{self.lam} = {self.personal_lr * self.lam:g}")
        return self


# --- AWCFL and MCFL, the options of every cluster-model method (methods/intercluster.py)

class AWCFLParams(HyperParams):
    beta: float = Field(0.5, ge=0, le=1, description="AWCFL weight of the other clusters (paper's best: 0.5)")


class MCFLParams(HyperParams):
    feature_samples: int = Field(100, ge=1, description="MCFL: inputs averaged into a feature mean (n)")


# --- methods/cfl.py

class CFLParams(HyperParams):
    eps1: float | None = Field(None, gt=0, description="split only when the norm of the cluster's mean update "
                                                       "is below this (default: 0.5 relative; 0.4 absolute, the "
                                                       "reference code's MNIST value)")
    eps2: float | None = Field(None, gt=0, description="…and the largest member update norm is above this "
                                                       "(default: 0.6 relative; 1.6 absolute, the reference "
                                                       "code's MNIST value)")
    warmup: int = Field(20, ge=0, description="no split before this many rounds have completed "
                                              "(reference code: c_round > 20)")
    min_members: int = Field(3, ge=2, description="split only clusters with at least this many members "
                                                  "updating this round (reference code: > 2)")
    gamma_max: float | None = Field(
        None, ge=0, lt=1,
        description="accept a split only if sqrt((1 - a)/2) > gamma_max, a = the largest cosine similarity "
                    "between members of the two halves (the paper's bound on the clients' gradient noise); "
                    "0 accepts every split, as the reference code (default: 0.5 relative, 0 absolute)")
    thresholds: Literal["absolute", "relative"] = Field(
        "relative", description="relative: eps1/eps2 are multiples of the warm-up rounds' mean largest client "
                                "update norm (scale-free); absolute: they are update norms (the reference code)")

    @model_validator(mode="after")
    def _relative_needs_warmup(self) -> "CFLParams":
        if self.thresholds == "relative" and self.warmup < 1:
            raise ValueError("thresholds: relative measures its scale in the warm-up rounds, so warmup must be >= 1")
        return self


# --- methods/cflgp.py

class CFLGPParams(HyperParams):
    clusters: int = Field(4, ge=1, description="K: cluster models (the authors' default 4)")
    period: int = Field(2, ge=1, description="rounds between two profile updates and clusterings (the authors' "
                                             "clustering_period: 2)")
    stop_after: int = Field(10, ge=1, description="no clustering from this round on (the authors' "
                                                  "clustering_termination_threshold: 10)")


# --- methods/fedgroup.py

class FedGroupParams(HyperParams):
    clusters: int = Field(3, ge=1, description="number of groups K (reference code default 3)")
    pretrain_scale: int = Field(20, ge=1, description="α: min(α·K, clients) clients pre-train for the "
                                                      "clustering (reference code: alpha=20)")
    pretrain_steps: int | None = Field(20, ge=1, description="local SGD steps of a pre-training (reference code: "
                                                             "20 iterations); null: the training block's budget")
    kmeans_iter: int = Field(20, ge=1, description="k-means iterations on the decomposed similarities "
                                                   "(reference code: max_iter=20)")
    kmeans_init: int = Field(10, ge=1, description="k-means++ restarts, lowest inertia kept (scikit-learn's "
                                                   "n_init=10 the reference code ran with)")


# --- methods/fesem.py

class FeSEMParams(HyperParams):
    clusters: int = Field(2, ge=1, description="number of centers K (the paper reports FeSEM(2), (3) and (4))")
    lam: float = Field(0.1, ge=0, description="λ: weight of the distance term (λ/m)·‖ω − Ω‖² in the local "
                                              "objective (the paper gives no value; the authors' code uses 0.1)")
    init_restarts: int = Field(20, ge=1, le=1000, description="random k-means initializations of the centers; the "
                                                     "one with the lowest intra-cluster distance is kept (paper: 20)")
    init_iter: int = Field(100, ge=1, description="Lloyd iterations of each initialization run")
    loss_weight: Literal["eq7", "none"] = Field(
        "eq7", description="eq7: the local objective α_i·L_i + (λ/m)·Dist with α_i = n_i/n (eq. 7), optimized "
                           "as L_i + λ/(m·α_i)·Dist; none: L_i + (λ/m)·Dist (the pull ≈ 2λ/m, nearly off)")


# --- methods/flhc.py

class FLHCParams(HyperParams):
    cluster_round: int = Field(
        10, ge=0,
        description="FedAvg rounds before the one clustering round (Briggs et al. cluster after a "
                    "fixed number of FedAvg rounds n; 10 here)")
    distance_threshold: float = Field(
        3.0, gt=0,
        description="cut the dendrogram where the merge distance exceeds this; its scale depends on the "
                    "model and local training (ignored when clusters is given)")
    threshold: Literal["absolute", "relative"] = Field(
        "absolute", description="absolute: distance_threshold is a distance between updates; relative: it is a "
                                "multiple of the mean norm of the updates being clustered (scale-free)")
    clusters: int | None = Field(
        None, ge=1, description="cut the dendrogram into this many clusters instead (overrides the threshold)")
    linkage: Literal["ward", "average", "complete", "single"] = Field(
        "ward", description="agglomeration linkage (the paper recommends ward)")
    metric: Literal["euclidean", "cosine", "cityblock"] = Field(
        "euclidean", description="distance between client updates (ward needs euclidean)")

    @model_validator(mode="after")
    def _ward_is_euclidean(self) -> "FLHCParams":
        if self.linkage == "ward" and self.metric != "euclidean":
            raise ValueError("ward linkage needs metric: euclidean")
        if self.threshold == "relative" and self.metric == "cosine":
            # cosine distances are scale-free already: scaling the cut by a norm would make it scale-dependent
            raise ValueError("threshold: relative needs metric: euclidean or cityblock (cosine distances have no scale)")
        return self

    def cut(self, mean_update_norm: float) -> dict[str, Any]:
        """How to cut the dendrogram, given the mean norm of the updates being clustered."""
        if self.clusters is not None:
            return {"n_clusters": self.clusters}
        scale = mean_update_norm if self.threshold == "relative" else 1.0
        return {"distance_threshold": self.distance_threshold * scale}


# --- methods/ifca.py

class IFCAParams(HyperParams):
    clusters: int = Field(2, ge=1, description="number of cluster models K (the paper's k; 2 by default, "
                                               "set it to the expected number of groups)")
    restarts: int = Field(1, ge=1, le=20, description="random initializations of the K models trained side by "
                                                      "side for `restart_rounds` rounds, the best then kept (the "
                                                      "paper's remedy for a bad start; 1: Algorithm 1 alone)")
    restart_rounds: int = Field(5, ge=1, description="rounds the restarts train side by side before the one "
                                                     "with the lowest training loss is kept")


# --- methods/kmeans_cfl.py

class KMeansCFLParams(HyperParams):
    clusters: int = Field(2, ge=1, description="K of the K-means on client models (paper: 2)")
    cluster_start: int = Field(20, ge=0, description="rounds of plain FedAvg before clustering (paper: 20)")
    n_init: int = Field(10, ge=1, description="K-means restarts (the best inertia wins)")


# --- methods/pacfl.py

class PACFLParams(HyperParams):
    basis: int = Field(3, ge=1, description="p: left singular vectors kept per label of a client's data "
                                            "(the authors' scripts: 3)")
    threshold: float = Field(4.9, gt=0, description="merge clusters while their proximity (degrees) is at most this "
                                                    "(the authors' CIFAR-10 script: 4.9; angles depend on the data, "
                                                    "see pacfl_angle_* in rounds.parquet)")
    clusters: int | None = Field(None, ge=1, description="cut into this many clusters instead of at the threshold")
    linkage: Literal["average", "maximum", "minimum"] = Field(
        "average", description="the authors' names: average (WPGMA, their default), maximum (complete), "
                               "minimum (single)")


# --- methods/fcca.py

class FCCAParams(HyperParams):
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


# --- methods/fedac.py

class LCFedParams(HyperParams):
    clusters: int = Field(2, ge=1, description="number of clusters K (at most: no cluster-number tuning adds one; a cluster "
                                                  "left without members is dropped)")
    mu: float = Field(0.01, ge=0, description="pull of the personalized model to its cluster center (μ)")
    lam: float = Field(0.1, ge=0, description="pull of the embedding to the global embedding Φ (λ)")
    components: int = Field(50, ge=1, description="PCA dimensions D of LrCos (paper: 50)")
    pca_every: int | None = Field(None, ge=1, description="refit the PCA map every N rounds (default: a tenth of "
                                                          "the run's rounds, the paper's 100 of 1,000)")
    similarity: Literal["lrcos", "l2"] = Field("lrcos", description="E-step similarity (ablation: l2)")


class FedACParams(LCFedParams):
    clusters: int = Field(2, ge=1, description="initial number of clusters K (CNT tunes it)")
    cnt: bool = Field(True, description="cluster-number tuning on/off (ablation)")
    cnt_low: float = Field(0.2, ge=0, description="CNT lower threshold a: G < a merges")
    cnt_high: float = Field(0.8, gt=0, description="CNT upper threshold b: G > b splits")
    cnt_start: int = Field(5, ge=0, description="rounds before CNT may act")
    max_clusters: int = Field(20, ge=1, description="CNT never splits beyond this many clusters")

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> "FedACParams":
        if self.cnt_low > self.cnt_high:
            raise ValueError(f"cnt_low ({self.cnt_low}) must be <= cnt_high ({self.cnt_high}): G < cnt_low merges, "
                             f"G > cnt_high splits")
        return self


# --- methods/fedtsdp.py

class FedTSDPParams(HyperParams):
    hopkins_threshold: float = Field(0.65, gt=0, lt=1, description="h_th: cluster only when H exceeds it")
    hopkins_fraction: float = Field(0.1, gt=0, le=1, description="m̃/m: share of the round's clients "
                                                                  "sampled for the Hopkins statistic")
    hopkins_min_samples: int = Field(1, ge=1, description="floor on m̃ (capped at m); 1: the paper's m̃ = 0.1·m "
                                                          "alone (a floor of 5 lowers the statistic's spread and "
                                                          "with it how soon the gate first opens)")
    hopkins_draws: int = Field(1, ge=1, description="H of Eq. 6 as the mean of this many draws of its random "
                                                     "points on the round's outputs (1: one draw a round, the paper's)")
    public_batch: int = Field(50, ge=2, description="B: public samples drawn per round")
    radii: Literal["relative", "absolute"] = Field(
        "relative", description="relative: ε2 multiplies the round's median distance from a client to its nearest "
                                "neighbour in its stage-1 group (scale-free); absolute: it is a distance (the paper's)")
    eps_js: float = Field(0.15, gt=0, description="ε1: DBSCAN radius on the JS divergence of outputs (JS lies in "
                                                  "[0, ln 2] whatever the model: the paper's value)")
    eps_weights: float | None = Field(None, gt=0, description="ε2: DBSCAN radius on the L2 distance of model "
                                                              "weights (default: 2 relative; 3.5 absolute, the "
                                                              "paper's CNN on CIFAR)")
    min_pts: int = Field(2, ge=1, description="DBSCAN min_pts of both stages")
    noise: Literal["cluster", "singletons", "previous"] = Field(
        "cluster", description="DBSCAN's noise points (the paper says nothing of them): one cluster of a stage's "
                               "noise (DBSCAN's label -1 taken as a group), each its own cluster, or each keeps "
                               "the cluster it was in")
    dampening: float = Field(0.98, gt=0, le=1, description="ψ: shared-layer dampening ratio")
    dampening_schedule: Literal["constant", "power"] = Field(
        "constant", description="L_s ← L_s·ψ at each clustering (constant) or L_s·ψ^r (power)")
    shared_layers: int | Literal["body"] | None = Field(
        None, description="initial number of shared layers (default: all, as the paper's Fig. 11; "
                          "body: all but the last, FedPer's split)")

    @field_validator("shared_layers")
    @classmethod
    def _non_negative(cls, value):
        if isinstance(value, int) and value < 0:
            raise ValueError("must be >= 0 (a number of layers), or 'body'")
        return value
    layer_rounding: Literal["round", "floor", "ceil"] = Field(
        "round", description="how the real-valued L_s becomes a number of layers")


# --- methods/fedem.py

class FedEMParams(HyperParams):
    # Named `clusters` as every method's K, so that a scenario's `hyperparams: {clusters: K}`
    # reaches it (and FedAC's PCA `components` stays apart).
    clusters: int = Field(3, ge=1, description="K: mixture components, one shared model each (the authors' "
                                                 "experiments: 3)")


# --- methods/fedgmm.py

class FedGMMParams(HyperParams):
    # Named `clusters` as every method's K (the classifiers carry the concept shift a scenario's
    # groups are made of), so that a scenario's `hyperparams: {clusters: K}` reaches it.
    clusters: int = Field(3, ge=1, description="M2: shared classifiers (the authors' n_learners: 3)")
    gmm_components: int = Field(3, ge=1, description="M1: Gaussian components of the embedded inputs (the "
                                                     "authors' n_gmm: 3)")
    embedding: int = Field(32, ge=1, description="dimensions of the inputs' embedding the Gaussians live on (the "
                                                 "authors' embedding_dimension: 32; at most the input size)")
    covariance_floor: float = Field(0.1, gt=0, description="added to each Gaussian's covariance diagonal (the "
                                                           "authors' eps: 0.1)")


# --- methods/fedsoft.py

class FedSoftParams(HyperParams):
    clusters: int = Field(2, ge=1, description="S: number of cluster models (the authors' experiments: the number "
                                               "of true distributions)")
    lam: float = Field(0.1, ge=0, description="λ: strength of the pull of a local model to the centers (the "
                                              "authors' code: 0.1 on MNIST and EMNIST, 0.01 on CIFAR-10)")
    estimation_interval: int = Field(2, ge=1, description="τ: rounds between two estimations of the importance "
                                                          "weights (the authors' main.py: 2)")
    smoother: float = Field(1e-4, gt=0, lt=1, description="σ: the share given to a cluster no sample matches, so "
                                                          "that every client keeps some weight in every center")


# --- methods/stocfl.py

class StoCFLParams(HyperParams):
    tau: float = Field(0.3, ge=-1, le=1, description="τ: unite two clusters whose mean anchor movements have a "
                                                     "cosine similarity of at least this (the authors' default 0.3)")
    mu: float = Field(0.1, ge=0, description="μ: pull of a cluster model towards the global model while a client "
                                             "trains it (the authors' 0.1)")
    observe_epochs: float = Field(1.0, gt=0, description="epochs of local SGD from the anchor that measure a "
                                                         "client's movement ψ (the authors' 1)")


# --- methods/icfl.py

class ICFLParams(HyperParams):
    eps1: float = Field(4.0, gt=math.e, description="ε₁ of the split bar α_t = 1 − (e/ε₁)^(t/ε₂): larger makes the "
                                                     "bar rise faster (FedRC's default 4; must exceed e)")
    alpha0: float = Field(0.85, gt=0, lt=1, description="α₀: the bar reaches it at round ε₂², "
                                                        "ε₂ = ln(1 − α₀)/(1 − ln ε₁) (FedRC's default 0.85)")


# --- methods/flux.py

class FLUXParams(HyperParams):
    th_round: float = Field(0.06, ge=0, description="cluster once the weighted accuracy of the global model on "
                                                    "the round's clients has risen by less than this in some round "
                                                    "(the authors' th_round 0.06), checked from the fourth round")
    max_round_fraction: float = Field(0.8, gt=0, le=1, description="cluster by this share of the rounds at the "
                                                                   "latest (the authors' 0.8)")
    cluster_round: int | None = Field(None, ge=0, description="cluster in this round (0-based) instead of by the "
                                                              "trigger (the authors' simulated path: 4)")
    eps_scaling: float = Field(1.0, gt=0, description="DBSCAN's eps is the knee of the sorted nearest-neighbour "
                                                      "distances times this (the authors' 1.0)")
    projection_points: int = Field(200, ge=2, description="random points the shared PCA projection of the features "
                                                          "is fitted on (the authors' 200)")


# --- methods/srfca.py

class SRFCAParams(HyperParams):
    init_steps: int = Field(250, ge=1, description="local steps of each client's own model before the one-shot "
                                                   "clustering (the authors' MNIST configs: 250–280)")
    dist_fraction: float = Field(0.25, gt=0, le=1, description="λ: this quantile of the clients' pairwise "
                                                               "cross-entropy distances (the authors' fallback)")
    threshold: float | None = Field(None, gt=0, description="λ itself instead, a mean cross-entropy (the authors' "
                                                            "tuned values are on another scale and do not carry over)")
    size_threshold: int = Field(2, ge=0, description="t: groups of at most t clients dropped at the start, clusters "
                                                     "of fewer than t at each re-clustering (the authors' 2)")
    trim: float = Field(0.15, ge=0, lt=0.5, description="β of the trimmed mean: each coordinate's members' values "
                                                        "sorted, those of ranks [int(β·n), int((1 − β)·n)) averaged (the "
                                                        "authors' 0.15; named trim, as beta is AWCFL's in srfca_awcfl)")
    refine_steps: int = Field(2, ge=1, description="refinement steps: the rounds are cut into this many blocks, "
                                                   "each cluster trained afresh in each (the authors' 2)")


# --- the declarations

def cluster_options(name: str, awcfl: str = "{name}_awcfl", mcfl: str = "{name}_mcfl") -> tuple:
    """The AWCFL and MCFL variants every cluster-model method has (methods/clustered.py), ICFL aside."""
    return ((awcfl.format(name=name), AWCFLParams, "AWCFL inter-cluster aggregation (β)"),
            (mcfl.format(name=name), MCFLParams, "MCFL multi-model selection by feature means"))


def fcca_options(name: str) -> tuple:
    """FCCA's +Per, +Prox and +Per+Prox (methods/fcca.py), for FCCA and a plugin's subclass of it."""
    return ((f"{name}_per", FCCAPerParams, "personal classifier (FedPer style)"),
            (f"{name}_prox", FCCAProxParams, "FedProx term μ"),
            (f"{name}_per_prox", FCCAPerProxParams, "personal classifier and FedProx term μ"))


def _cfl_starts(hp: CFLParams) -> tuple[str, int]:
    return "warmup", hp.warmup  # a split is decided from 0-based round `warmup` on


def _flux_starts(hp: FLUXParams) -> tuple[str, int]:
    # The trigger reads three gains first: the clustering is in round 3 (0-based) at the earliest.
    return ("cluster_round", hp.cluster_round) if hp.cluster_round is not None else ("th_round", 3)


def _flhc_starts(hp: FLHCParams) -> tuple[str, int]:
    return "cluster_round", hp.cluster_round


def _kmeans_cfl_starts(hp: KMeansCFLParams) -> tuple[str, int]:
    return "cluster_start", max(hp.cluster_start - 1, 0)  # clusters once round + 1 >= cluster_start


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
                          f"ones it did, ARI 1.00); at its paper's own settings, Dirichlet 0.5, its cINNs had "
                          f"not: with K = 20 as mini-batch steps ARI 0.13 or less on LEAF Synthetic and MNIST-1D; "
                          f"as passes (the default) only in part "
                          f"(docs/fcca.md)"))
    return found


# FedTSDP's clustering signal is one round's local drift away from a shared model: below this
# many local steps its Hopkins gate rarely opened on the robustness map (docs/robustness.md).
FEDTSDP_MIN_LOCAL_STEPS = 20


def _fedtsdp_premises(hp: FedTSDPParams, training: Any, scenario: Any) -> list[tuple[str, str]]:
    found = []
    if training.clients_per_round < scenario.participants:
        found.append(("", f"its Hopkins gate and clustering read only the round's {training.clients_per_round} of "
                          f"{scenario.participants} clients (the paper samples all of them); with half of them it "
                          f"recovered the groups in none of the robustness map's 12 cells (docs/robustness.md)"))
    if training.local_steps is not None and training.local_steps < FEDTSDP_MIN_LOCAL_STEPS:
        found.append(("", f"it clusters by how far one round's local training moves each client's outputs from the "
                          f"shared model (the paper trains 2 local epochs); with all clients every round it recovered "
                          f"the groups in 1 of the robustness map's 6 cells at 5 local steps (where its gate opened, "
                          f"DBSCAN kept one cluster), in 3 at 20 (docs/robustness.md); this run has "
                          f"{training.local_steps}"))
    return found


def _fedtsdp_limits(hp: FedTSDPParams, training: Any, scenario: Any) -> list[tuple[str, str]]:
    layers = model_layers(training.model)  # a plugin's network: checked when the run builds it
    if layers is not None and isinstance(hp.shared_layers, int) and hp.shared_layers > layers:
        return [("shared_layers", f"must be <= {layers} (the layers of model {training.model}), "
                                  f"got {hp.shared_layers}")]
    return []


def _fesem_premises(hp: FeSEMParams, training: Any, scenario: Any) -> list[tuple[str, str]]:
    skewed = any(step.kind in ("dirichlet", "pathological") for step in scenario.partition)
    if not (skewed and scenario.true_groups and training.local_steps is not None and training.local_steps < 20):
        return []
    return [("", f"its first clustering, of models one round from a common start, is the one it keeps (a client "
                 f"trains from its center, pulled to it, and stays nearest to it); under label skew inside the "
                 f"groups, 5 local steps left that clustering at ARI 0.15 on the robustness map's Dirichlet 1.0 "
                 f"cells, 20 at 0.91 (docs/robustness.md); this run has {training.local_steps}")]


def _pacfl_premises(hp: PACFLParams, training: Any, scenario: Any) -> list[tuple[str, str]]:
    truth = [step.kind for step in scenario.group_steps() if step.ground_truth]
    if not truth or set(truth) != {"label_swap"}:
        return []
    return [("", "PACFL compares the subspaces of each label's inputs, not which label an input has: label-swap "
                 "groups hold the same inputs, so it cannot tell them apart (ARI about 0 on the robustness map); "
                 "its figures there are those of an arbitrary clustering")]


_CLUSTERED_K = Capabilities(clustered=True, k_param="clusters")
_PERSONAL = Capabilities(personalized=True)
_PERSONAL_CLUSTERED_K = Capabilities(clustered=True, personalized=True, k_param="clusters")
_SOFT_K = Capabilities(clustered=True, personalized=True, k_param="clusters", soft=True)

# Baselines and personalized methods.
declare("fedavg", HyperParams, "cflpipe.methods.fedavg:FedAvg",
        family="baseline")
declare("fedprox", FedProxParams, "cflpipe.methods.fedprox:FedProx",
        family="baseline")
declare("local", HyperParams, "cflpipe.methods.local:Local",
        _PERSONAL, family="baseline")
declare("fedper", HyperParams, "cflpipe.methods.fedper:FedPer",
        _PERSONAL, family="personalized")
declare("perfedavg", PerFedAvgParams, "cflpipe.methods.perfedavg:PerFedAvg",
        _PERSONAL, family="personalized")
declare("ditto", DittoParams, "cflpipe.methods.ditto:Ditto",
        _PERSONAL, family="personalized")
declare("cgpfl", CGPFLParams, "cflpipe.methods.cgpfl:CGPFL",
        _PERSONAL_CLUSTERED_K, family="personalized")

# Cluster-model methods (methods/clustered.py), each with its AWCFL and MCFL variants.
declare("oracle", HyperParams, "cflpipe.methods.oracle:Oracle",
        Capabilities(needs_groups=True, clustered=True), variants=cluster_options("oracle"), family="reference",
        variant_family="modifier")
declare("cfl", CFLParams, "cflpipe.methods.cfl:CFL",
        Capabilities(clustered=True), _cfl_starts, cluster_options("cfl"), family="clustered",
        variant_family="modifier")
declare("cflgp", CFLGPParams, "cflpipe.methods.cflgp:CFLGP",
        _CLUSTERED_K, variants=cluster_options("cflgp"), family="clustered", variant_family="modifier")
declare("fedgroup", FedGroupParams, "cflpipe.methods.fedgroup:FedGroup",
        _CLUSTERED_K, variants=cluster_options("fedgroup"), family="clustered", variant_family="modifier")
declare("fesem", FeSEMParams, "cflpipe.methods.fesem:FeSEM",
        _CLUSTERED_K, variants=cluster_options("fesem"), premises=_fesem_premises,
        needs="a first round of local training long enough to tell the groups apart: it keeps its first clustering",
        family="seed", variant_family="modifier")
declare("flhc", FLHCParams, "cflpipe.methods.flhc:FLHC",
        _CLUSTERED_K, _flhc_starts, cluster_options("flhc"), family="clustered", variant_family="modifier")
declare("ifca", IFCAParams, "cflpipe.methods.ifca:IFCA",
        _CLUSTERED_K, variants=cluster_options("ifca"), family="clustered", variant_family="modifier")
# AWCFL and MCFL are the paper's own algorithms on K-means CFL: their variants keep the bare names.
declare("kmeans_cfl", KMeansCFLParams, "cflpipe.methods.kmeans_cfl:KMeansCFL",
        _CLUSTERED_K, _kmeans_cfl_starts, cluster_options("kmeans_cfl", awcfl="awcfl", mcfl="mcfl"),
        family="clustered", variant_family="seed")
declare("pacfl", PACFLParams, "cflpipe.methods.pacfl:PACFL",
        _CLUSTERED_K, variants=cluster_options("pacfl"), premises=_pacfl_premises,
        needs="groups that differ in their inputs (rotation, flip, label skew); label swaps look alike to it",
        family="clustered", variant_family="modifier")

# The other clustered methods.
declare("fcca", FCCAParams, "cflpipe.methods.fcca:FCCA",
        _CLUSTERED_K, variants=fcca_options("fcca"), premises=_fcca_premises,
        needs="cINNs that have learnt each held label's conditional: the paper's K = 20 as passes over the "
              "client's data (flow_epochs; with 5 mini-batch steps D carried no group signal); under label skew "
              "at its paper's settings even that recovered the label-exchange groups only in part (docs/fcca.md)",
        family="seed")
declare("fedac", FedACParams, "cflpipe.methods.fedac:FedAC",
        _PERSONAL_CLUSTERED_K, family="seed")
declare("lcfed", LCFedParams, "cflpipe.methods.lcfed:LCFed",
        _PERSONAL_CLUSTERED_K, family="clustered")
declare("fedtsdp", FedTSDPParams, "cflpipe.methods.fedtsdp:FedTSDP",
        Capabilities(clustered=True, personalized=True, needs_public=True), premises=_fedtsdp_premises,
        limits=_fedtsdp_limits,
        needs="every client every round and the paper's local budget (2 epochs; 20 steps or more): its gate reads "
              "one round's drift of the round's clients' outputs",
        family="seed")
declare("fedem", FedEMParams, "cflpipe.methods.fedem:FedEM",
        _SOFT_K, family="clustered")
declare("fedrc", FedEMParams, "cflpipe.methods.fedem:FedRC",
        _SOFT_K, family="clustered")
declare("fedgmm", FedGMMParams, "cflpipe.methods.fedgmm:FedGMM",
        _SOFT_K, family="clustered")
declare("fedsoft", FedSoftParams, "cflpipe.methods.fedsoft:FedSoft",
        _SOFT_K, family="clustered")
declare("flux", FLUXParams, "cflpipe.methods.flux:FLUX",
        Capabilities(clustered=True), _flux_starts, cluster_options("flux"), family="clustered",
        variant_family="modifier")
declare("srfca", SRFCAParams, "cflpipe.methods.srfca:SRFCA",
        Capabilities(clustered=True), variants=cluster_options("srfca"), family="clustered",
        variant_family="modifier")
declare("icfl", ICFLParams, "cflpipe.methods.icfl:ICFL",
        Capabilities(clustered=True), family="clustered")
declare("stocfl", StoCFLParams, "cflpipe.methods.stocfl:StoCFL",
        Capabilities(clustered=True), family="clustered")
