"""The pydantic models of a spec's parts: training settings, partition steps, scenarios and
method entries. No torch: model names are checked as names only."""

from __future__ import annotations

import inspect
import math

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from cflpipe.fl.axes import scenario_axes
from cflpipe.spec._errors import _short

# Upper bound of counts a spec sets (rounds, clients, devices, restarts): far beyond any real
# experiment, low enough that a typo cannot ask for years of work or all the memory.
MAX_COUNT = 1_000_000
# Names become paths and command-line arguments: no leading dash (Snakemake would read an option).
NAME_PATTERN = re.compile(r"[a-z0-9_][a-z0-9_-]*")


class Strict(BaseModel):
    # strict: `clients: true` or `rounds: "5"` are errors, not 1 and 5 (ints still fill floats)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --------------------------------------------------------------------------- training

# cflpipe.models' built-in networks (that module imports torch, this one must not).
MODEL_NAMES = ("mlp", "cnn", "cnn_tsdp", "cnn_pfl", "resnet18")
BUILTIN_TRAINERS = ("auto", "sequential", "batched", "processes", "distributed")
MAX_MLP_DEPTH = 64


def mlp_depth(name: str) -> int | None:
    """The depth d of a model named `mlp<d>` (an MLP with d linear layers, 2 ≤ d ≤ 64), else None."""
    match = re.fullmatch(r"mlp([1-9][0-9]?)", name)
    return int(match.group(1)) if match and 2 <= int(match.group(1)) <= MAX_MLP_DEPTH else None


# The layers of each built-in network (its ParamSpace.num_layers, whatever the input; a test keeps
# them equal): what a method's per-layer setting may count up to, checked at validate.
MODEL_LAYERS = {"mlp": 3, "cnn": 5, "cnn_tsdp": 4, "cnn_pfl": 4, "resnet18": 10}


def model_layers(name: str) -> int | None:
    """The layers of a built-in network (mlp<d>: d), None for a plugin's or a module:Class one."""
    return mlp_depth(name) or MODEL_LAYERS.get(name)


# training.full_eval_clients auto: every client of a population up to this size, a seeded sample
# of this many in a larger one. 1,000 clients' mean accuracy is within about ±1 point (95 %) of
# every client's for a 15-point spread between clients; at 10,000 clients a full final evaluation
# was 2.7–6.3 training rounds for the methods with a model per client (#59).
AUTO_EVAL_CLIENTS = 1_000


def evaluated_clients(training: "Training", clients: int, moves: bool = False) -> int:
    """How many clients a full evaluation of a population of `clients` reads
    (training.full_eval_clients; `moves`: the scenario moves clients between groups)."""
    wanted = training.full_eval_clients
    if moves:  # drift figures follow every mover at every full evaluation: a scenario that moves clients reads all
        return clients
    return clients if wanted == "all" else min(AUTO_EVAL_CLIENTS if wanted == "auto" else wanted, clients)


class Training(Strict):
    """Training settings shared by every run; a scenario or method may override any key."""

    model: str = Field("cnn", description="network: built in (cflpipe.models), a plugin's (entry point group "
                                          "cflpipe.models) or a module:Class reference")
    rounds: int = Field(40, ge=1, le=MAX_COUNT, description="communication rounds")
    clients_per_round: int = Field(10, ge=1, description="clients sampled each round")
    local_steps: int | None = Field(5, ge=1, description="local SGD iterations per round")
    local_epochs: float | None = Field(
        None, gt=0, description="local epochs per round (instead of local_steps)"
    )
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.05, gt=0, description="learning rate")
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    lr_decay: float = Field(1.0, gt=0, le=1, description="lr multiplier applied every round")
    eval_every: int = Field(5, ge=1, description="evaluate every N rounds (and the last round)")
    eval_clients: int | None = Field(
        None, ge=1, description="evaluate a seeded sample of this many clients (and their pooled test data) at "
                                "evaluation rounds that are not full ones (drawn from full_eval_clients' sample "
                                "where it samples); clusters.parquet is always every client's (null: every "
                                "evaluation is full)")
    full_eval_clients: Annotated[int, Field(ge=1)] | Literal["auto", "all"] = Field(
        "auto", description="the clients a full evaluation reads (every evaluation without eval_clients; with it, "
                            "the last round's and full_eval_every's): all; n, a seeded sample of n (by the run's "
                            "seed alone: every full evaluation of the run, and every method of the scenario, reads "
                            "the same clients); auto: every client in a population of at most 1,000, a seeded sample "
                            "of 1,000 in a larger one; every client, whatever the value, where the scenario moves "
                            "clients between groups (its drift figures follow each mover). clusters.parquet is always "
                            "every client's; ARI, AMI and NMI are scored on the clients full evaluations read")
    eval_train: bool | Literal["auto"] = Field(
        "auto", description="also evaluate clients' models on their training split (metrics rows with split "
                            "train, train_acc_macro): true every client's, false none (the test split only), "
                            "auto every client's where an evaluation then costs no more than a training round, "
                            "else a seeded sample of clients that keeps it within one")
    eval_test: bool = Field(
        True, description="evaluate on the clients' test splits; false (the validation split, and the training "
                          "split as eval_train says, alone) is what tuning gives its trials, whose files hold no "
                          "test figure: a spec's own runs keep it true")
    full_eval_every: int | None = Field(
        None, ge=1, description="with eval_clients: evaluate every client every N rounds (and in the last "
                                "round, always); null: only in the last round")
    checkpoint_every: int = Field(10, ge=1, description="save resumable state every N rounds")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    trainer: str = Field(
        "auto", description="how client plans are executed: one client after the other (sequential), all of a "
                            "round's clients at once with torch.func (batched), or one after the other in "
                            "`workers` CPU processes (processes: bit-identical to sequential) or in the CPU "
                            "processes torchrun starts (distributed: likewise where every rank has the same CPU kernels; "
                            "without torchrun, sequential); auto: batched on "
                            "CUDA and with compile, on a CPU the faster of sequential and batched as measured on the "
                            "run's plans the first time their shape meets the results folder (recorded in its "
                            "trainer-choices.json); "
                            "or a plugin's trainer (entry point group cflpipe.trainers) or a module:Class reference")
    workers: int | None = Field(
        None, ge=1, description="trainer processes: the worker processes a round's clients are spread over "
                                "(default: the CPUs this process may use); results do not depend on it")
    eval_batch_size: int = Field(256, ge=1, description="samples per forward pass in evaluation")
    precision: Literal["float32", "tf32", "bf16"] = Field(
        "float32", description="local training's forward and backward passes: float32 (bit-identical "
                               "reruns on one machine; cuDNN's convolutions use TF32 by PyTorch's default), "
                               "tf32 (CUDA matmuls in TensorFloat-32 too; no effect on a CPU) or bf16 "
                               "(torch.autocast to bfloat16); tf32 and bf16 are not bit-identical to float32, "
                               "reproducible per machine; evaluation's forward passes stay float32 (a method's "
                               "training before evaluation, Per-FedAvg's fine-tuning, follows precision)")
    compile: bool = Field(
        False, description="batched trainer: compile its vmapped step with torch.compile (Inductor), fewer and "
                           "fused kernels; each distinct group shape compiles once per process (seconds to a "
                           "minute); not bit-identical to the uncompiled step, reproducible per machine; methods "
                           "that train one client at a time run uncompiled; needs trainer batched or auto")
    on_divergence: Literal["stop", "skip"] = Field(
        "stop", description="NaN/inf loss: stop the run, or skip that client's update"
    )
    client_store: Literal["memory", "disk"] = Field(
        "memory", description="where the client store (what clients keep between rounds: personal models, "
                              "mixture weights) and the clients' inputs live: memory, or disk (memory-mapped files in the "
                              "run's state folder, the pages a round touched handed back after it: resident memory "
                              "follows the round's clients, not clients × parameters or every client's data; CPU "
                              "only); the same bytes either way")
    keep_state: bool = Field(
        False, description="keep a finished run's whole checkpoint (models, method state); false cuts it down "
                           "to the tables its outputs are written from")

    @field_validator("full_eval_clients", mode="before")
    @classmethod
    def _population(cls, value: Any) -> Any:
        # one line for a bad value, not one per branch of the union
        if value in ("auto", "all") or (type(value) is int and value >= 1):
            return value
        raise ValueError(f"must be a number of clients (>= 1), 'auto' or 'all', got {_short(value)}")

    @field_validator("trainer")
    @classmethod
    def _trainer_name(cls, value: str) -> str:
        from cflpipe.plugins import TRAINERS_GROUP, entry_point_names, is_reference

        names = [*BUILTIN_TRAINERS, *entry_point_names(TRAINERS_GROUP)]
        if value in names or is_reference(value):
            return value
        raise ValueError(f"must be one of {', '.join(map(repr, names))} or a module:Class reference, "
                         f"got {_short(value)}")

    @field_validator("model")
    @classmethod
    def _model_name(cls, value: str) -> str:
        # Names only (no torch here): whether a plugin's model imports is checked by parse_spec.
        from cflpipe.plugins import MODELS_GROUP, entry_point_names, is_reference

        names = [*MODEL_NAMES, *(n for n in entry_point_names(MODELS_GROUP) if n not in MODEL_NAMES)]
        if value in names or is_reference(value) or mlp_depth(value) is not None:
            return value
        raise ValueError(f"must be one of {', '.join(map(repr, names))}, mlp<d> (an MLP of d = 2…{MAX_MLP_DEPTH} "
                         f"linear layers, e.g. mlp11) or a module:Class reference, got {_short(value)}")

    @model_validator(mode="before")
    @classmethod
    def _epochs_replace_steps(cls, data: Any) -> Any:
        # local_epochs given without local_steps means "epochs instead of the default steps".
        if isinstance(data, dict) and data.get("local_epochs") is not None and "local_steps" not in data:
            data = {**data, "local_steps": None}
        return data

    @model_validator(mode="after")
    def _one_local_budget(self) -> "Training":
        if (self.local_steps is None) == (self.local_epochs is None):
            raise ValueError("give exactly one of local_steps and local_epochs")
        return self

    @model_validator(mode="after")
    def _compile_needs_the_batched_step(self) -> "Training":
        if self.compile and self.trainer not in ("batched", "auto"):
            raise ValueError(f"compile: true compiles the batched trainer's step; trainer is {self.trainer!r}, "
                             f"allowed with compile: batched or auto")
        return self

    def definition(self) -> dict[str, Any]:
        """The settings that make a run what it is (its config.yaml and workflow params): all but
        what only says what to keep of it afterwards, so changing that redoes no run; settings
        added later only where they differ from their defaults, so that runs recorded before they
        existed stay the same runs."""
        data = self.model_dump(mode="json", exclude=set(TRAINING_NOT_IN_RUN))
        for key, default in LATER_TRAINING_DEFAULTS.items():
            if data.get(key) == default:
                data.pop(key)
        return same_trainer_as_sequential(data)

    def is_evaluated(self, round_number: int) -> bool:
        """Whether 1-based round `round_number` ends with an evaluation (sampled or full)."""
        return round_number % self.eval_every == 0 or round_number == self.rounds or \
            (self.full_eval_every is not None and round_number % self.full_eval_every == 0)

    def is_full_evaluation(self, round_number: int) -> bool:
        """Whether an evaluation in this round is a full one: it reads every client, or
        full_eval_clients' sample of them."""
        return self.eval_clients is None or round_number == self.rounds or \
            (self.full_eval_every is not None and round_number % self.full_eval_every == 0)


TRAINING_KEYS = tuple(Training.model_fields)
# Trainers that run the sequential trainer's kernels in its order elsewhere, so a run gets its
# bytes: which of them trained a run is how it ran, like its thread count (timing.json says which),
# not what it is. Switching between them re-trains nothing.
SEQUENTIAL_TRAINERS = ("sequential", "processes", "distributed")


def same_trainer_as_sequential(training: dict[str, Any]) -> dict[str, Any]:
    """A run's training settings (as data) with `processes` and `distributed` written as the
    `sequential` they equal."""
    if training.get("trainer") in SEQUENTIAL_TRAINERS[1:]:
        return {**training, "trainer": "sequential"}
    return training


# Training keys that change what is kept of a run, or how fast it runs, not its results.
TRAINING_NOT_IN_RUN = ("keep_state", "workers", "client_store")
# Training keys added after runs were first recorded, with their defaults: left out of a run's
# definition while at their default.
LATER_TRAINING_DEFAULTS = {"eval_clients": None, "full_eval_every": None, "eval_train": True, "eval_test": True,
                           "precision": "float32", "compile": False, "full_eval_clients": "auto"}


def merge_training(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """Overlay training layers (spec < scenario < method). A layer that sets one local budget
    (local_steps or local_epochs) replaces the other, so `{local_epochs: 1}` in a scenario
    overrides the spec's default `local_steps`."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)
        for key, other in (("local_epochs", "local_steps"), ("local_steps", "local_epochs")):
            if layer.get(key) is not None and other not in layer:
                merged[other] = None
    return merged


# --------------------------------------------------------------------------- partition steps


class IIDStep(Strict):
    kind: Literal["iid"]


class DirichletStep(Strict):
    kind: Literal["dirichlet"]
    alpha: float = Field(gt=0, description="concentration; smaller is more skewed")
    min_size: int = Field(10, ge=0, description="minimum samples per client")


class PathologicalStep(Strict):
    kind: Literal["pathological"]
    labels_per_client: int = Field(ge=1, description="distinct labels each client holds (shards)")
    label_sets: Literal["cyclic", "random"] = Field(
        "cyclic", description="cyclic: consecutive labels from evenly spread starts (every label held by "
                              "about as many clients, at most C distinct sets); random: each client draws its "
                              "labels uniformly at random, as most papers (a label may be held by no client)")


class QuantityStep(Strict):
    kind: Literal["quantity"]
    min: int = Field(ge=1, description="smallest client size")
    max: int = Field(ge=1, description="largest client size")

    @model_validator(mode="after")
    def _ordered(self) -> "QuantityStep":
        if self.max < self.min:
            raise ValueError(f"max must be >= min ({self.min}), got {self.max}")
        return self


class NaturalStep(Strict):
    """One client per generating device of a naturally federated dataset (LEAF Synthetic,
    FEMNIST's writers, CelebA's celebrities)."""

    kind: Literal["natural"]
    holdout: Literal["fraction", "dataset"] = Field(
        "fraction", description="each client's test set: test_fraction of its samples, or its samples in "
                                "the dataset's own test split (LEAF's sample- or user-level split; needs pool: all)")


# Every group transform's `ground_truth` key.
GROUND_TRUTH = Field(True, description="its groups are part of the scenario's ground-truth groups (false: a shift "
                                       "every client may carry that a method should not cluster by, e.g. FedRC's "
                                       "feature shift beside a concept shift)")


class RotationStep(Strict):
    kind: Literal["rotation"]
    groups: int = Field(ge=1)
    angles: list[float] | None = Field(None, description="degrees per group; default evenly spaced")
    ground_truth: bool = GROUND_TRUTH

    @model_validator(mode="after")
    def _angles_per_group(self) -> "RotationStep":
        if self.angles is not None and len(self.angles) != self.groups:
            raise ValueError(f"angles must list one angle per group ({self.groups}), got {len(self.angles)}")
        return self

    def group_angles(self) -> list[float]:
        if self.angles is not None:
            return [float(a) for a in self.angles]
        return [360.0 * g / self.groups for g in range(self.groups)]


class LabelSwapStep(Strict):
    """Label-swap groups: group 0 keeps the labels, every other group applies its own fixed
    permutation: a random full permutation (default) or, with `pairs: n`, n disjoint label
    pairs swapped (CFL's setting, Sattler et al., which FCCA's paper cites for its split)."""

    kind: Literal["label_swap"]
    groups: int = Field(ge=1)
    pairs: int | None = Field(None, ge=1)
    ground_truth: bool = GROUND_TRUTH


FLIP_AXES = ("none", "horizontal", "vertical", "both")


class FlipStep(Strict):
    """Image flips per group (AWCFL's "flipped" clients): group g uses axes[g]."""

    kind: Literal["flip"]
    groups: int = Field(2, ge=1, le=4)
    axes: list[Literal["none", "horizontal", "vertical", "both"]] | None = None
    ground_truth: bool = GROUND_TRUTH

    @model_validator(mode="after")
    def _axes_per_group(self) -> "FlipStep":
        if self.axes is not None and len(self.axes) != self.groups:
            raise ValueError(f"axes must list one axis per group ({self.groups}), got {len(self.axes)}")
        return self

    def group_axes(self) -> list[str]:
        return list(self.axes) if self.axes is not None else list(FLIP_AXES[: self.groups])


def step_text(step) -> str:
    """A group transform in a few words: "3 label_swap", "2 rotation (0/90°)", "2 label_swap (1
    pair)", "2 rotation, not ground truth"."""
    detail = ""
    if step.kind == "rotation" and step.angles is not None:
        detail = f" ({'/'.join(f'{a:g}' for a in step.angles)}°)"
    elif step.kind == "label_swap" and step.pairs is not None:
        detail = f" ({step.pairs} pair{'s' * (step.pairs > 1)})"
    elif step.kind == "flip" and step.axes is not None:
        detail = f" ({'/'.join(step.axes)})"
    return f"{step.groups} {step.kind}{detail}" + ("" if step.ground_truth else ", not ground truth")


class MixtureStep(Strict):
    """Clients whose data mix the scenario's groups (FedEM's, FedSoft's and FedRC's premise): each
    client draws weights over the groups ~ Dir(alpha), and each of its samples takes a group's
    transform in those proportions (exact counts, largest remainders). Its ground-truth group is
    its largest weight; the weights are recorded (stats.parquet `weight_<g>`)."""

    kind: Literal["mixture"]
    alpha: float = Field(gt=0, description="concentration of each client's group weights; small: one group "
                                           "dominates, large: an even mix")


PartitionStep = Annotated[
    Union[IIDStep, DirichletStep, PathologicalStep, QuantityStep, NaturalStep,
          RotationStep, LabelSwapStep, FlipStep, MixtureStep],
    Field(discriminator="kind"),
]
LABEL_SPLITS = ("iid", "dirichlet", "pathological", "natural")
GROUP_TRANSFORMS = ("rotation", "label_swap", "flip")


# --------------------------------------------------------------------------- scenario / method


class DatasetRef(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class PublicData(Strict):
    """Samples the server holds without their labels and never gives to a client (FedTSDP's public
    unlabeled data: the dataset's test images without labels)."""

    source: Literal["test"] = Field("test", description="the dataset's test split (needs pool: train)")
    size: int | None = Field(None, ge=1, description="samples drawn from the source, seeded by the "
                                                     "scenario seed (default: all of it)")


class DriftEvent(Strict):
    """Groups that change (docs/new-clients.md): from 1-based round `round` on (before it trains), a
    seeded share of the clients (the scenario seed's choice, the same for every method and run seed)
    belongs to another ground-truth group, drawn among the others; its samples, train and test
    alike, take that group's transform. Recorded in the partition (drift.parquet)."""

    round: int = Field(ge=2, le=MAX_COUNT, description="the first round (1-based) trained on the moved clients' "
                                                       "new data; at least 2")
    fraction: float = Field(gt=0, lt=1, description="share of the clients that move (at least one)")


# Partition-step options added after partitions were first written, with their defaults: left out
# of a scenario's definition when at the default, so existing partitions keep their fingerprints.
LATER_STEP_DEFAULTS = {"natural": {"holdout": "fraction"}, "pathological": {"label_sets": "cyclic"},
                       **{kind: {"ground_truth": True} for kind in GROUP_TRANSFORMS}}


# A display name: one line of text, shown in figures and tables instead of the entry's name.
LABEL_MAX = 80


def check_label(value: str | None) -> str | None:
    # isprintable: no line or paragraph separators, tabs or control characters of any kind
    if value is not None and (not value.strip() or not value.isprintable() or value != value.strip()):
        raise ValueError(f"must be one line of text that is not blank, got {_short(value)}; printable "
                         f"characters only, no surrounding spaces")
    return value


def label_field(what: str):
    return Field(None, min_length=1, max_length=LABEL_MAX,
                 description=f"display name of the {what} in the report's figures and tables (default: its name); "
                             f"cosmetic: it does not change any run")


class Scenario(Strict):
    dataset: DatasetRef
    label: str | None = label_field("scenario")
    clients: int = Field(ge=1, le=MAX_COUNT)
    test_fraction: float = Field(0.2, gt=0, lt=1, description="share of each client's data held out")
    validation_fraction: float = Field(
        0.0, ge=0, lt=1, description="share of each client's training data held out for validation (what picks the "
                                     "best round in summary.json, never the test data): never trained on; 0: "
                                     "no validation split")
    pool: Literal["all", "train"] = Field(
        "all", description="partition the dataset's train+test pool, or only its train split"
    )
    seed: int = Field(0, ge=0, le=2**63 - 1, description="partition seed (training seeds are the spec's `seeds`)")
    partition: list[PartitionStep] = Field(default_factory=lambda: [IIDStep(kind="iid")], min_length=1)
    training: dict[str, Any] = Field(default_factory=dict, description="overrides of `training`")
    hyperparams: dict[str, Any] = Field(
        default_factory=dict,
        description="method hyper-parameters for every method of this scenario that has them, e.g. "
                    "`clusters: 4` (its number of true groups); a method entry's own value wins")
    public: PublicData | None = Field(None, description="unlabeled data held by the server (FedTSDP)")
    new_clients: float | None = Field(
        None, gt=0, lt=1, description="share of the clients held out as new clients (a seeded choice per run seed): "
                                      "never sampled for training, never seen by the server; at every full "
                                      "evaluation each method places them by its own rule (new_acc_macro, new_ari)")
    drift: list[DriftEvent] | None = Field(
        None, min_length=1, description="groups that change: each event moves a seeded share of the clients to "
                                        "another ground-truth group from its round on (moved_acc_macro, drift_joined)")

    _label = field_validator("label")(classmethod(lambda cls, value: check_label(value)))

    @field_validator("dataset", mode="before")
    @classmethod
    def _dataset_shorthand(cls, value: Any) -> Any:
        # `dataset: digits` or `dataset: {name: synthetic, alpha: 1, ...}`.
        if isinstance(value, str):
            return {"name": value}
        if isinstance(value, dict) and "name" in value and "params" not in value:
            return {"name": value["name"], "params": {k: v for k, v in value.items() if k != "name"}}
        return value

    @model_validator(mode="after")
    def _steps_compose(self) -> "Scenario":
        kinds = [step.kind for step in self.partition]
        splits = [k for k in kinds if k in LABEL_SPLITS]
        if len(splits) > 1:
            raise ValueError(f"partition has more than one label split ({', '.join(splits)}); use one of "
                             f"{', '.join(LABEL_SPLITS)}")
        if kinds.count("quantity") > 1:
            raise ValueError("partition has more than one quantity step")
        if "quantity" in kinds and "natural" in kinds:
            raise ValueError("partition: quantity cannot resize a natural split")
        transforms = [k for k in kinds if k in GROUP_TRANSFORMS]
        twice = sorted({k for k in transforms if transforms.count(k) > 1})
        if twice:
            raise ValueError(f"partition has more than one {twice[0]} step; give each group transform once (several "
                             f"kinds combine: every client draws one group of each)")
        if kinds.count("mixture") > 1:
            raise ValueError("partition has more than one mixture step")
        if "mixture" in kinds and not transforms:
            raise ValueError(f"partition: mixture mixes the groups of a group transform ({', '.join(GROUP_TRANSFORMS)}); "
                             f"add one")
        if "mixture" in kinds and not any(step.ground_truth for step in self.group_steps()):
            raise ValueError("partition: mixture weighs a client's ground-truth groups, and no group transform here "
                             "has ground_truth: true; give one of them ground_truth: true")
        natural = self.step("natural")
        if natural is not None and natural.holdout == "dataset" and self.pool != "all":
            raise ValueError("partition: natural with holdout: dataset takes each client's test samples from "
                             "the dataset's test split, so it needs pool: all")
        if self.public is not None and self.public.source == "test" and self.pool != "train":
            raise ValueError("public.source: 'test' needs pool: train (with pool: all the test split is "
                             "dealt to the clients, so the server's samples would not be public-only)")
        if self.drift is not None:
            self._drift_composes(kinds)
        for index, step in enumerate(self.partition):
            if step.kind in GROUP_TRANSFORMS and step.groups > self.clients:
                raise ValueError(f"partition[{index}].groups: must be <= clients ({self.clients}), got {step.groups}")
        cells = math.prod(step.groups for step in self.group_steps())
        if len(transforms) > 1 and "mixture" not in kinds and cells > self.clients:
            raise ValueError(f"partition: the group transforms combine into {cells} groups "
                             f"({' × '.join(str(s.groups) for s in self.group_steps())}), more than the {self.clients} "
                             f"clients; fewer groups, more clients, or a mixture step")
        return self

    def _drift_composes(self, kinds: list[str]) -> None:
        truth = [step for step in self.group_steps() if step.ground_truth]
        if not truth or math.prod(step.groups for step in truth) < 2:
            raise ValueError("drift: moves clients to another ground-truth group, and this partition has no two; "
                             "it needs a group transform (rotation, label_swap, flip) with 2 or more groups and "
                             "ground_truth: true")
        if "mixture" in kinds:
            raise ValueError("drift: a mixture client's samples come from several groups, so it has none to leave; "
                             "drift needs a partition without a mixture step")
        if self.new_clients is not None:
            raise ValueError("drift: not with new_clients in one scenario (a new client's move would be seen by no "
                             "training); give each its own scenario")
        rounds = [event.round for event in self.drift]
        if rounds != sorted(set(rounds)):
            raise ValueError(f"drift: the events' rounds must increase, got {', '.join(map(str, rounds))}")

    def drift_count(self, event: DriftEvent) -> int:
        """How many clients an event moves (at least one)."""
        return max(1, round(event.fraction * self.clients))

    def new_client_count(self) -> int:
        """How many clients `new_clients` holds out (at least one; 0 without it)."""
        return 0 if self.new_clients is None else max(1, round(self.new_clients * self.clients))

    @property
    def participants(self) -> int:
        """The clients that take part in training (all but the new clients)."""
        return self.clients - self.new_client_count()

    def definition(self) -> dict[str, Any]:
        """The scenario as data, without its training and hyper-parameter overrides (they reach a
        run through its resolved training and hyperparams, not its partition) and without its
        `label` (cosmetic: a new label re-partitions and re-trains nothing); options added later
        (`public`, `validation_fraction`, `new_clients`, `drift`, a natural step's `holdout`) only where they differ from their defaults, so that
        partitions and runs written before they existed keep their fingerprints."""
        data = self.model_dump(mode="json", exclude={"training", "hyperparams", "label"})
        if data.get("public") is None:
            data.pop("public", None)
        if data.get("validation_fraction") == 0:
            data.pop("validation_fraction", None)
        if data.get("new_clients") is None:
            data.pop("new_clients", None)
        if data.get("drift") is None:
            data.pop("drift", None)
        for key in scenario_axes():
            if data.get(key) is None:
                data.pop(key, None)
        for step in data["partition"]:
            for key, default in LATER_STEP_DEFAULTS.get(step.get("kind"), {}).items():
                if step.get(key) == default:
                    step.pop(key)
        return data

    def group_step(self) -> RotationStep | LabelSwapStep | FlipStep | None:
        """The first group transform (None without one)."""
        return next(iter(self.group_steps()), None)

    def group_steps(self) -> list[RotationStep | LabelSwapStep | FlipStep]:
        """The group transforms in their order; several combine (every client draws one group of each)."""
        return [step for step in self.partition if step.kind in GROUP_TRANSFORMS]  # type: ignore[misc]

    @property
    def true_groups(self) -> int:
        """The number of ground-truth groups: the product of the groups of the transforms that
        define them (0: none)."""
        steps = [step for step in self.group_steps() if step.ground_truth]
        return math.prod(step.groups for step in steps) if steps else 0

    def groups_text(self) -> str:
        """How the scenario's groups are made, for people: "4 (4 rotation)", "6 (2 rotation × 3
        label_swap), mixed in each client by Dirichlet 0.5", "3 (2 rotation, not ground truth × 3
        label_swap)"; "none"."""
        steps = self.group_steps()
        if not steps:
            return "none"
        text = f"{self.true_groups or 'none'} ({' × '.join(step_text(s) for s in steps)})"
        mixture = self.step("mixture")
        return text + (f", mixed in each client by Dirichlet {mixture.alpha:g}" if mixture is not None else "")

    def step(self, kind: str):
        return next((s for s in self.partition if s.kind == kind), None)


def _with_keyed_axes(base: type[Scenario]) -> type[Scenario]:
    """The scenario with a field for each evaluation axis that has a key of its own
    (fl/axes SCENARIO_AXES): its settings, or null without it."""
    fields: dict[str, Any] = {
        key: (cls.Settings | None, Field(None, description=inspect.getdoc(cls).split("\n\n")[0].replace("\n", " ")))
        for key, cls in scenario_axes().items()}
    return create_model("Scenario", __base__=base, __module__=__name__, **fields)


Scenario = _with_keyed_axes(Scenario)


class MethodEntry(BaseModel):
    """`name: {method: TYPE, training: {...}, <hyper-parameters>}`; TYPE defaults to the name."""

    model_config = ConfigDict(extra="allow", frozen=True)
    method: str | None = None
    training: dict[str, Any] = Field(default_factory=dict)
    scenarios: list[str] | None = Field(None, min_length=1, description="run only on these scenarios (default: "
                                        "all; an empty list would run the method nowhere)")
    # A declared field, so never one of the method's hyper-parameters (which reach a run's config).
    label: str | None = label_field("method")

    @field_validator("label", mode="before")
    @classmethod
    def _label(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, str):  # the entry is lax: no 5 -> "5"
            raise ValueError(f"must be a string, got {_short(value)}")
        return check_label(value)

    @property
    def hyperparams(self) -> dict[str, Any]:
        return dict(self.model_extra or {})
