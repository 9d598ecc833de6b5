"""The YAML experiment spec as pydantic models.

A spec is datasets × partition scenarios × methods × seeds. Every validation error is turned
into one line `yaml.path: what is wrong, got VALUE` so a researcher can fix the file without
reading a traceback. This module must not import torch.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from cflpipe.errors import SpecError

# Upper bound of counts a spec sets (rounds, clients, devices, restarts): far beyond any real
# experiment, low enough that a typo cannot ask for years of work or all the memory.
MAX_COUNT = 1_000_000
# A spec is a short text file; beyond this it is some other file given by mistake.
MAX_SPEC_BYTES = 1 << 20
# torch.manual_seed takes a signed 64-bit integer.
MAX_SEED = 2**63 - 1
# Names become paths and command-line arguments: no leading dash (Snakemake would read an option).
NAME_PATTERN = re.compile(r"[a-z0-9_][a-z0-9_-]*")


class Strict(BaseModel):
    # strict: `clients: true` or `rounds: "5"` are errors, not 1 and 5 (ints still fill floats)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --------------------------------------------------------------------------- training

# cflpipe.models' built-in networks (that module imports torch, this one must not).
MODEL_NAMES = ("mlp", "cnn", "cnn_tsdp", "resnet18")
BUILTIN_TRAINERS = ("auto", "sequential", "batched")
MAX_MLP_DEPTH = 64


def mlp_depth(name: str) -> int | None:
    """The depth d of a model named `mlp<d>` (an MLP with d linear layers, 2 ≤ d ≤ 64), else None."""
    match = re.fullmatch(r"mlp([1-9][0-9]?)", name)
    return int(match.group(1)) if match and 2 <= int(match.group(1)) <= MAX_MLP_DEPTH else None


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
    checkpoint_every: int = Field(10, ge=1, description="save resumable state every N rounds")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    trainer: str = Field(
        "auto", description="how client plans are executed: one client after the other, or all of a round's "
                            "clients at once with torch.func (auto: batched on CUDA and for the cnn on CPU, "
                            "where it is measured faster; sequential otherwise); or a plugin's trainer "
                            "(entry point group cflpipe.trainers) or a module:Class reference")
    eval_batch_size: int = Field(256, ge=1, description="samples per forward pass in evaluation")
    on_divergence: Literal["stop", "skip"] = Field(
        "stop", description="NaN/inf loss: stop the run, or skip that client's update"
    )
    keep_state: bool = Field(
        False, description="keep a finished run's whole checkpoint (models, method state); false cuts it down "
                           "to the tables its outputs are written from")

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

    def definition(self) -> dict[str, Any]:
        """The settings that make a run what it is (its config.yaml and workflow params): all but
        what only says what to keep of it afterwards, so changing that redoes no run."""
        return self.model_dump(mode="json", exclude=set(TRAINING_NOT_IN_RUN))


TRAINING_KEYS = tuple(Training.model_fields)
# Training keys that change what is kept of a run, not its results.
TRAINING_NOT_IN_RUN = ("keep_state",)


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


class RotationStep(Strict):
    kind: Literal["rotation"]
    groups: int = Field(ge=1)
    angles: list[float] | None = Field(None, description="degrees per group; default evenly spaced")

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


FLIP_AXES = ("none", "horizontal", "vertical", "both")


class FlipStep(Strict):
    """Image flips per group (AWCFL's "flipped" clients): group g uses axes[g]."""

    kind: Literal["flip"]
    groups: int = Field(2, ge=1, le=4)
    axes: list[Literal["none", "horizontal", "vertical", "both"]] | None = None

    @model_validator(mode="after")
    def _axes_per_group(self) -> "FlipStep":
        if self.axes is not None and len(self.axes) != self.groups:
            raise ValueError(f"axes must list one axis per group ({self.groups}), got {len(self.axes)}")
        return self

    def group_axes(self) -> list[str]:
        return list(self.axes) if self.axes is not None else list(FLIP_AXES[: self.groups])


PartitionStep = Annotated[
    Union[IIDStep, DirichletStep, PathologicalStep, QuantityStep, NaturalStep,
          RotationStep, LabelSwapStep, FlipStep],
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


# Partition-step options added after partitions were first written, with their defaults: left out
# of a scenario's definition when at the default, so existing partitions keep their fingerprints.
LATER_STEP_DEFAULTS = {"natural": {"holdout": "fraction"}, "pathological": {"label_sets": "cyclic"}}


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
        if len(transforms) > 1:
            raise ValueError(f"partition has more than one group transform ({', '.join(transforms)})")
        natural = self.step("natural")
        if natural is not None and natural.holdout == "dataset" and self.pool != "all":
            raise ValueError("partition: natural with holdout: dataset takes each client's test samples from "
                             "the dataset's test split, so it needs pool: all")
        if self.public is not None and self.public.source == "test" and self.pool != "train":
            raise ValueError("public.source: 'test' needs pool: train (with pool: all the test split is "
                             "dealt to the clients, so the server's samples would not be public-only)")
        for index, step in enumerate(self.partition):
            if step.kind in GROUP_TRANSFORMS and step.groups > self.clients:
                raise ValueError(f"partition[{index}].groups: must be <= clients ({self.clients}), got {step.groups}")
        return self

    def definition(self) -> dict[str, Any]:
        """The scenario as data, without its training and hyper-parameter overrides (they reach a
        run through its resolved training and hyperparams, not its partition) and without its
        `label` (cosmetic: a new label re-partitions and re-trains nothing); options added later
        (`public`, a natural step's `holdout`) only where they differ from their defaults, so that
        partitions and runs written before they existed keep their fingerprints."""
        data = self.model_dump(mode="json", exclude={"training", "hyperparams", "label"})
        if data.get("public") is None:
            data.pop("public", None)
        for step in data["partition"]:
            for key, default in LATER_STEP_DEFAULTS.get(step.get("kind"), {}).items():
                if step.get(key) == default:
                    step.pop(key)
        return data

    def group_step(self) -> RotationStep | LabelSwapStep | FlipStep | None:
        for step in self.partition:
            if step.kind in GROUP_TRANSFORMS:
                return step  # type: ignore[return-value]
        return None

    def step(self, kind: str):
        return next((s for s in self.partition if s.kind == kind), None)


class MethodEntry(BaseModel):
    """`name: {method: TYPE, training: {...}, <hyper-parameters>}`; TYPE defaults to the name."""

    model_config = ConfigDict(extra="allow", frozen=True)
    method: str | None = None
    training: dict[str, Any] = Field(default_factory=dict)
    scenarios: list[str] | None = Field(None, description="run only on these scenarios (default: all)")
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


# Figures of summary.parquet a paper table may show (report/aggregate.py's SUMMARY_FIGURES; the
# wall-clock seconds_per_round is a cost a paper reports too, not byte-reproducible), and those
# printed in percent by default.
TABLE_FIGURES = ("acc_macro", "acc_micro", "acc_worst10", "global_acc_mean", "f1_macro", "f1_micro", "ari",
                 "nmi", "n_clusters", "intra_acc", "inter_acc", "bytes_down_total", "bytes_up_total",
                 "bytes_total", "seconds_per_round")
PERCENT_FIGURES = ("acc_macro", "acc_micro", "acc_worst10", "global_acc_mean", "f1_macro", "f1_micro",
                   "intra_acc", "inter_acc")


class PaperTableEntry(Strict):
    """One paper-style table: a final figure, mean ± std over seeds, methods × scenarios."""

    figure: Literal[TABLE_FIGURES]  # type: ignore[valid-type]
    title: str = Field(min_length=1)
    percent: bool | None = None  # default: accuracies and F1 in percent
    digits: int = Field(1, ge=0, le=6)

    @property
    def scale(self) -> float:
        percent = self.figure in PERCENT_FIGURES if self.percent is None else self.percent
        return 100.0 if percent else 1.0


class ReportOptions(Strict):
    """`report:` — which paper tables to write (default: personalized accuracy; the ARI table
    follows whenever a scenario has ground-truth groups)."""

    tables: list[PaperTableEntry] | None = Field(None, min_length=1)


# What a finished run has written in its folder (Spec.run_dir): a run lacking one is not finished
# (its outputs are rebuilt from its last checkpoint); the workflow declares them. Here, not in the
# engine, so that Snakemake's main process reads them without importing torch.
RUN_OUTPUT_FILES = ("metrics.parquet", "clusters.parquet", "rounds.parquet", "timing.parquet", "timing.json",
                    "plots.csv", "summary.json", "config.yaml")


class WorkflowOptions(Strict):
    """`workflow:` — how Snakemake and DVC cut the spec's runs into jobs. Changes no run."""

    # One process per job pays Python's and torch's start-up (2–3 s) once: per scenario, the
    # default spec's 156 runs are 4 jobs instead of 52 (2 min 48 s–3 min 12 s on 2 cores, against
    # 4 min 41 s per scenario × method and 8 min 18 s per run). Per method gives more, shorter
    # jobs: a cluster runs long runs in parallel.
    train_jobs: Literal["scenario", "method"] = Field(
        "scenario", description="one training job per scenario (every method × seed of it, one after the other) "
                                "or per scenario × method (every seed of it)")


class Spec(Strict):
    description: str | None = None
    seeds: list[int] = Field([0], min_length=1)
    training: Training = Field(default_factory=Training)
    scenarios: dict[str, Scenario] = Field(min_length=1)
    methods: dict[str, MethodEntry] = Field(min_length=1)
    # A spec read from a file defaults to results/<file stem> (load_spec), so two specs share one
    # folder only if their files share a name; "results" is the default of a spec built in code.
    results_dir: str = Field("results", min_length=1)
    data_dir: str = Field("resources/datasets", min_length=1)
    report: ReportOptions = Field(default_factory=ReportOptions)
    workflow: WorkflowOptions = Field(default_factory=WorkflowOptions)
    # {expanded entry: the `sweep:` entry it comes from}; not a field, so no dump or hash sees it.
    _sweeps: dict[str, SweepOrigin] = PrivateAttr(default_factory=dict)
    # The file the spec was read from (load_spec), for the report to say which spec it covers.
    _source: str | None = PrivateAttr(None)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: list[int]) -> list[int]:
        for seed in seeds:
            if not 0 <= seed <= MAX_SEED:
                raise ValueError(f"seeds must lie in [0, {MAX_SEED}] (torch's seed range), got {seed}")
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct, got {seeds}")
        return seeds

    @field_validator("scenarios", "methods")
    @classmethod
    def _names(cls, entries: dict[str, Any]) -> dict[str, Any]:
        for name in entries:
            if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
                raise ValueError(f"name {name!r} must match [a-z0-9_][a-z0-9_-]* (it becomes a path; no "
                                 f"leading dash)")
        return entries

    # ------------------------------------------------------------------ resolution

    def method_type(self, method: str) -> str:
        return self.methods[method].method or method

    def method_entry(self, method: str) -> str:
        """The key in the spec file's `methods:` that defines `method`: its own name, or for an
        entry expanded from a `sweep:`, the sweeping entry's (what DVC tracks as a param)."""
        origin = self._sweeps.get(method)
        return origin.entry if origin is not None else method

    def method_label(self, method: str) -> str:
        """What the report calls the method entry: its `label`, else its name."""
        return self.methods[method].label or method

    def scenario_label(self, scenario: str) -> str:
        return self.scenarios[scenario].label or scenario

    def resolved_training(self, scenario: str, method: str) -> Training:
        return Training(**merge_training([self.training.model_dump(), self.scenarios[scenario].training,
                                          self.methods[method].training]))

    def matrix(self) -> list[tuple[str, str, int]]:
        """Every (scenario, method, seed) run the spec asks for, in a stable order."""
        return [(s, m, k) for s in self.scenarios for m in self.methods for k in self.seeds
                if self.runs_on(m, s)]

    def runs_on(self, method: str, scenario: str) -> bool:
        only = self.methods[method].scenarios
        return only is None or scenario in only

    def run_dir(self, scenario: str, method: str, seed: int) -> Path:
        """The folder of one run: its RUN_OUTPUT_FILES and state/ checkpoint."""
        return Path(self.results_dir) / "runs" / scenario / method / f"seed{seed}"

    def partition_dir(self, scenario: str) -> Path:
        return Path(self.results_dir) / "partitions" / scenario


# --------------------------------------------------------------------------- errors


_MESSAGES = {
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "missing": "is required",
    "extra_forbidden": "unknown key",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "too_short": "must have at least {min_length} entries",
    "string_too_short": "must not be empty",
    "string_too_long": "must have at most {max_length} characters",
    "literal_error": "must be one of {expected}",
    "union_tag_invalid": "must be one of {expected_tags}",  # path gets the tag key appended
    "union_tag_not_found": "needs a `{discriminator}` key",
}


def _yaml_path(loc: tuple, data: Any) -> str:
    """Turn a pydantic location into the path a user sees in the YAML file, dropping the
    internal steps (union tags, validator names) that have no counterpart in the input."""
    parts: list[str] = []
    node = data
    for position, key in enumerate(loc):
        last = position == len(loc) - 1
        if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            parts.append(f"[{key}]")
            node = node[key]
        elif isinstance(node, dict) and key in node:
            parts.append(f".{key}" if parts else str(key))
            node = node[key]
        elif last and isinstance(key, str) and isinstance(node, dict):
            parts.append(f".{key}" if parts else str(key))
            node = None
        elif isinstance(node, (dict, list)) or node is None:
            continue  # an internal step such as a union tag
    return "".join(parts) or "spec"


def _format_error(error: dict, data: Any, prefix: str = "") -> str:
    path = _yaml_path(tuple(error["loc"]), data)
    if prefix:
        path = prefix if path == "spec" else f"{prefix}.{path}" if not path.startswith("[") else prefix + path
    kind = error["type"]
    ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v
           for k, v in (error.get("ctx") or {}).items()}
    if kind == "value_error":
        message = str(ctx.get("error", error["msg"]))
        return f"{path}: {message}"
    if kind in _MESSAGES:
        try:
            message = _MESSAGES[kind].format(**ctx)
        except (KeyError, IndexError):
            message = error["msg"]
    else:
        message = error["msg"][0].lower() + error["msg"][1:]
    if kind == "missing":
        return f"{path}: {message}"
    if kind == "union_tag_invalid":
        return f"{path}.{ctx.get('discriminator', 'kind').strip(chr(39))}: {message}, got {_short(ctx.get('tag'))}"
    value = error.get("input")
    return f"{path}: {message}, got {_short(value)}"


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
    if text.endswith("\n..."):
        text = text[:-4]
    text = text.removesuffix("...").strip()
    return text if len(text) <= 60 else text[:57] + "..."


def errors_to_lines(exc: ValidationError, data: Any, prefix: str = "", model: type[BaseModel] | None = None
                    ) -> list[str]:
    """One line per error; with the validated `model`, an unknown key's line lists the allowed keys."""
    lines = []
    for err in exc.errors():
        line = _format_error(err, data, prefix)
        if err["type"] == "extra_forbidden" and model is not None:
            allowed = _keys_at(model, tuple(err["loc"])[:-1])
            if allowed:
                line += f"; allowed: {', '.join(allowed)}"
        lines.append(line)
    return lines


def _keys_at(annotation: Any, loc: tuple) -> list[str] | None:
    """The field names of the model reached by following `loc` from `annotation` (through
    models, dicts, lists and tagged unions), or None when the path leads elsewhere."""
    from typing import get_args, get_origin

    def unwrap(node: Any) -> list[Any]:
        origin = get_origin(node)
        if origin is Annotated:
            return unwrap(get_args(node)[0])
        if origin is Union or type(node).__name__ == "UnionType":
            return [member for arg in get_args(node) for member in unwrap(arg)]
        return [node]

    nodes = unwrap(annotation)
    for part in loc:
        following = []
        for node in nodes:
            origin = get_origin(node)
            if isinstance(node, type) and issubclass(node, BaseModel) and part in node.model_fields:
                following += unwrap(node.model_fields[part].annotation)
            elif origin is dict:
                following += unwrap(get_args(node)[1])
            elif origin is list and isinstance(part, int):
                following += unwrap(get_args(node)[0])
        # A tagged union reports the tag as a path part: keep the member whose `kind` it is.
        tagged = [n for n in nodes if isinstance(n, type) and issubclass(n, BaseModel) and "kind" in n.model_fields
                  and get_args(n.model_fields["kind"].annotation) == (part,)]
        nodes = tagged or following
        if not nodes:
            return None
    models = [n for n in nodes if isinstance(n, type) and issubclass(n, BaseModel)]
    return list(models[0].model_fields) if len(models) == 1 else None


# --------------------------------------------------------------------------- sweeps

# A method entry's `sweep:` expands into one entry per combination of values when the spec is
# loaded, so every consumer (Snakemake, `cflpipe dvc-runs`, `train --method`, the report) sees
# ordinary entries, each identical to the same entry written out by hand (nothing re-trains when
# a spec switches between the two). An explicit key rather than list values: a hyper-parameter
# may itself take a list.
SWEEP_KEY = "sweep"
# A typo such as `{from: 1, to: 100000}` should not turn into a hundred thousand training jobs.
MAX_SWEEP_ENTRIES = 1000
HYPERPARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Keys of a method entry that are not hyper-parameters of its method.
RESERVED_ENTRY_KEYS = (*MethodEntry.model_fields, SWEEP_KEY)


class SweepOrigin(BaseModel):
    """Where an expanded entry comes from: the entry of the spec file and its swept values."""

    model_config = ConfigDict(frozen=True)
    entry: str
    values: dict[str, Any]
    # Whether the entry gives `method:` or its name is the type (an error about the type is
    # then at the entry itself, as for an entry written without a sweep).
    typed: bool = True


def _sweep_values(spec: Any, where: str) -> list[Any]:
    """A sweep's values: a list, or an integer range `{from: A, to: B, step: S}` (B included)."""
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - {"from", "to", "step"}, key=str)
        if unknown:
            raise SpecError(f"{where}.{unknown[0]}: unknown key; allowed: from, to, step")
        bounds = {k: spec.get(k, 1 if k == "step" else None) for k in ("from", "to", "step")}
        for k, v in bounds.items():
            if not isinstance(v, int) or isinstance(v, bool):
                raise SpecError(f"{where}.{k}: must be an integer, got {_short(v)}" if v is not None
                                else f"{where}.{k}: is required (a range is {{from: A, to: B, step: S}})")
        if bounds["step"] < 1:
            raise SpecError(f"{where}.step: must be >= 1, got {bounds['step']}")
        if bounds["to"] < bounds["from"]:
            raise SpecError(f"{where}.to: must be >= from ({bounds['from']}), got {bounds['to']}")
        count = (bounds["to"] - bounds["from"]) // bounds["step"] + 1
        if count > MAX_SWEEP_ENTRIES:
            raise SpecError(f"{where}: a range of {count} values; a sweep has at most {MAX_SWEEP_ENTRIES} entries")
        return list(range(bounds["from"], bounds["to"] + 1, bounds["step"]))
    if not isinstance(spec, list) or not spec:
        raise SpecError(f"{where}: must be a non-empty list of values or a range {{from: A, to: B, step: S}}, "
                        f"got {_short(spec)}")
    for index, value in enumerate(spec):
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise SpecError(f"{where}[{index}]: a swept value must be a number, a string, true/false or null "
                            f"(it names an entry), got {_short(value)}")
    return list(spec)


def _sweep_token(value: Any) -> str:
    """A value as part of an entry name ([a-z0-9_-]): 0.5 -> 0p5, -2 -> m2, 1e-05 -> 1e-05."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        text = repr(value).replace("+", "")  # shortest round-trip form: 0.1, 1e-05, 1e20
        return ("m" + text[1:] if text.startswith("-") else text).replace(".", "p")
    return re.sub(r"[^a-z0-9_-]", "_", value.lower()) or "_"


def _sweep_text(value: Any) -> str:
    """A value as a label shows it."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value) if isinstance(value, float) else str(value)


def expand_sweeps(data: Any) -> tuple[Any, dict[str, SweepOrigin]]:
    """The spec data with every `methods.NAME.sweep` expanded, and {expanded name: origin}.

    `NAME: {method: T, sweep: {k1: [a, b], k2: [c]}, ...}` becomes one entry per combination (the
    Cartesian product, in the order written), named `NAME-k1a-k2c` and labelled
    `LABEL (k1=a, k2=c)` (LABEL: the entry's label, else NAME), with `method: T` (T defaults to
    NAME) and every other key of the entry. Anything malformed that is not the sweep's own
    business is left to the normal validation, which reports it at the entry's path."""
    import itertools

    methods = data.get("methods") if isinstance(data, dict) else None
    if not isinstance(methods, dict) or not any(isinstance(e, dict) and SWEEP_KEY in e for e in methods.values()):
        return data, {}
    written = {name for name, entry in methods.items() if not (isinstance(entry, dict) and SWEEP_KEY in entry)}
    expanded: dict[Any, Any] = {}
    origins: dict[str, SweepOrigin] = {}
    for name, entry in methods.items():
        if not (isinstance(entry, dict) and SWEEP_KEY in entry) or not isinstance(name, str) \
                or not NAME_PATTERN.fullmatch(name):
            expanded[name] = entry  # a bad name is reported by Spec as it was written
            continue
        where = f"methods.{name}.{SWEEP_KEY}"
        sweep = entry[SWEEP_KEY]
        if not isinstance(sweep, dict) or not sweep:
            raise SpecError(f"{where}: must be a mapping of hyper-parameter to values, e.g. {{beta: [0, 0.5, 1]}}, "
                            f"got {_short(sweep)}")
        axes: list[tuple[str, list[Any]]] = []
        for key, values in sweep.items():
            if not isinstance(key, str) or not HYPERPARAM_NAME.fullmatch(key) or key in MethodEntry.model_fields:
                reserved = f" ({key} is not a hyper-parameter)" if key in MethodEntry.model_fields else ""
                raise SpecError(f"{where}.{key}: a sweep varies hyper-parameters of the method{reserved}; "
                                f"`cflpipe methods` lists them")
            if key in entry:
                raise SpecError(f"methods.{name}.{key}: also swept in {where}.{key}; give it in one place")
            values = _sweep_values(values, f"{where}.{key}")
            # Distinct as values (1 and 1.0 would train the same entry twice), as names ('A', 'a')
            # and as labels (0.1 and '0.1' would be two entries the report shows under one name).
            tokens = [_sweep_token(v) for v in values]
            texts = [_sweep_text(v) for v in values]
            for i, value in enumerate(values):
                same = [w for w, t, x in zip(values[:i], tokens[:i], texts[:i]) if t == tokens[i] or x == texts[i]
                        or (w == value and isinstance(w, bool) == isinstance(value, bool))]
                if same:
                    raise SpecError(f"{where}.{key}: values must be distinct, got {_short(same[0])} and "
                                    f"{_short(value)}")
            axes.append((key, values))
        count = math.prod(len(values) for _, values in axes)
        if count > MAX_SWEEP_ENTRIES:
            raise SpecError(f"{where}: expands to {count} entries; a sweep has at most {MAX_SWEEP_ENTRIES}")
        base = {k: v for k, v in entry.items() if k != SWEEP_KEY}
        base["method"] = entry.get("method") or name
        label = entry.get("label")
        for combination in itertools.product(*(values for _, values in axes)):
            chosen = dict(zip((key for key, _ in axes), combination))
            new_name = name + "".join(f"-{key.lower()}{_sweep_token(v)}" for key, v in chosen.items())
            if new_name in written or new_name in origins:
                other = f"methods.{origins[new_name].entry}.{SWEEP_KEY}" if new_name in origins else f"methods.{new_name}"
                raise SpecError(f"{where}: expands to the entry name {new_name!r}, which {other} gives too; rename "
                                f"one of the two")
            new_entry = {**base, **chosen}
            if label is None or isinstance(label, str):
                text = f"{label or name} ({', '.join(f'{k}={_sweep_text(v)}' for k, v in chosen.items())})"
                if len(text) <= LABEL_MAX:
                    new_entry["label"] = text
                elif label is not None:
                    raise SpecError(f"methods.{name}.label: with the swept values appended, {text!r} is longer "
                                    f"than {LABEL_MAX} characters; shorten the label")
            expanded[new_name] = new_entry
            origins[new_name] = SweepOrigin(entry=name, values=chosen, typed=bool(entry.get("method")))
    return {**data, "methods": expanded}, origins


def _sweep_paths(lines: list[str], origins: dict[str, SweepOrigin]) -> list[str]:
    """Error lines about expanded entries, pointed at what the spec file says: `methods.E.k` of a
    swept `k` becomes `methods.NAME.sweep.k`, any other `methods.E…` becomes `methods.NAME…`.
    Lines that become the same (a bad `training:` of the entry, once per expanded entry) merge."""
    out = []
    for line in lines:
        for new_name, origin in origins.items():
            prefix = f"methods.{new_name}"
            if line.startswith(prefix) and line[len(prefix):len(prefix) + 1] in ("", ".", ":", "["):
                rest = line[len(prefix):]
                key = re.match(r"\.([A-Za-z0-9_]+)", rest)
                if key and key.group(1) in origin.values:
                    # the value of one expanded entry would read as the whole sweep's
                    rest = f".{SWEEP_KEY}{re.sub(r': unknown key, got .*?; allowed:', ': unknown key; allowed:', rest)}"
                line = f"methods.{origin.entry}{rest}"
                break
        out.append(line)
    return list(dict.fromkeys(out))


# --------------------------------------------------------------------------- loading


def parse_spec(data: Any, *, check_methods: bool = True, check_datasets: bool = True) -> Spec:
    if not isinstance(data, dict):
        raise SpecError(f"spec: must be a mapping of seeds/training/scenarios/methods, got {_short(data)}")
    _check_expanded_size(data)
    non_finite = list(_non_finite_numbers(data, ""))
    if non_finite:
        raise SpecError("\n".join(f"{where}: must be a finite number, got {value}" for where, value in non_finite))
    data, origins = expand_sweeps(data)
    try:
        spec = Spec(**data)
    except ValidationError as exc:
        raise SpecError("\n".join(_sweep_paths(errors_to_lines(exc, data, model=Spec), origins))) from None
    spec._sweeps = origins
    problems: list[str] = _check_labels(spec)
    for name, scenario in spec.scenarios.items():
        base = f"scenarios.{name}"
        if check_datasets:
            problems += _check_dataset(scenario, base)
        problems += _check_training(spec, data, name, None)
    for method, entry in spec.methods.items():
        for index, name in enumerate(entry.scenarios or []):
            if name not in spec.scenarios:
                problems.append(f"methods.{method}.scenarios[{index}]: unknown scenario {name!r}; "
                                f"allowed: {', '.join(spec.scenarios)}")
        for scenario in spec.scenarios:
            if spec.runs_on(method, scenario):
                problems += _check_training(spec, data, scenario, method)
        if check_methods:
            problems += _check_method(spec, method)
    if check_methods:
        problems += _check_scenario_hyperparams(spec)
        problems += _check_models(spec)
    if problems:
        # A bad scenario override would otherwise be reported once per method.
        raise SpecError("\n".join(_sweep_paths(problems, origins)))
    return spec


def _check_models(spec: Spec) -> list[str]:
    """Models that are not built in (a plugin's, a module:Class reference) import: one line at the
    key that names them when they do not. Other names are Training's to refuse: one line per mistake."""
    from cflpipe.models import model_factory
    from cflpipe.plugins import MODELS_GROUP, entry_point_names, is_reference

    layers = [("training", spec.training.model_dump())]
    layers += [(f"scenarios.{name}.training", sc.training) for name, sc in spec.scenarios.items()]
    layers += [(f"methods.{name}.training", entry.training) for name, entry in spec.methods.items()]
    problems = []
    for where, layer in layers:
        model = layer.get("model")
        if isinstance(model, str) and model not in MODEL_NAMES and \
                (is_reference(model) or model in entry_point_names(MODELS_GROUP)):
            try:
                model_factory(model, f"{where}.model")
            except SpecError as exc:
                problems.append(str(exc))
    return problems


def _check_labels(spec: Spec) -> list[str]:
    """Two entries shown under one name would be one legend entry and one table row."""
    problems = []
    for key, entries in (("scenarios", spec.scenarios), ("methods", spec.methods)):
        shown: dict[str, str] = {}
        for name, entry in entries.items():
            text = entry.label or name
            if text in shown:
                other = shown[text]
                if entry.label:
                    problems.append(f"{key}.{name}.label: {text!r} is already the name shown for {key}.{other}; "
                                    f"a label must differ from every other entry's label and name")
                else:
                    problems.append(f"{key}.{other}.label: {text!r} is the name of {key}.{name}; a label must "
                                    f"differ from every other entry's label and name")
            shown[text] = name
    return problems


# Values a spec may hold once YAML aliases are expanded: far above any real spec (a 1 MiB file
# has at most about 500,000 values), far below what an alias bomb expands to (10^9 and more).
MAX_SPEC_VALUES = 1_000_000


def _check_expanded_size(data: Any) -> None:
    """Refuse a spec whose aliases expand it beyond MAX_SPEC_VALUES values, or that contains
    itself, in time linear in its distinct nodes: every later step walks the expanded tree."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(value: Any) -> int:
        if not isinstance(value, (dict, list, tuple)):
            return 1
        key = id(value)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise SpecError("spec: a YAML alias refers to a mapping or list that contains it (a cycle); "
                            "a spec is a finite tree")
        open_nodes.add(key)
        children = value.values() if isinstance(value, dict) else value
        total = 1 + sum(size(child) for child in children) + (len(value) if isinstance(value, dict) else 0)
        open_nodes.discard(key)
        sizes[key] = total
        if total > MAX_SPEC_VALUES:
            raise SpecError(f"spec: its YAML aliases expand it to more than {MAX_SPEC_VALUES:,} values (an alias "
                            f"bomb?); write the values out, or use fewer nested aliases")
        return total

    try:
        size(data)
    except RecursionError:
        raise SpecError("spec: nested too deeply to be a spec") from None


def _non_finite_numbers(value: Any, where: str):
    """(YAML path, value) of every NaN or ±inf anywhere in the spec: no field of a spec, a
    method's hyper-parameters or a dataset's parameters means anything with them, and bounds
    such as `gt=0` let +inf through."""
    if isinstance(value, float) and not math.isfinite(value):
        yield where or "spec", value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite_numbers(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _non_finite_numbers(item, f"{where}[{index}]")


def _check_dataset(scenario: Scenario, base: str) -> list[str]:
    from cflpipe.data.base import dataset_info

    try:
        info = dataset_info(scenario.dataset.name, f"{base}.dataset")
    except SpecError as exc:
        return [str(exc)]
    try:
        info.params(**scenario.dataset.params)
    except ValidationError as exc:
        return errors_to_lines(exc, scenario.dataset.params, f"{base}.dataset", model=info.params)
    return []


def training_key_path(spec: Spec, scenario: str, method: str, key: str) -> str:
    """Where a run's training setting comes from: `methods.M.training.key`, then the scenario's,
    then the spec's `training.key` (also where a default is reported)."""
    layers = [(f"methods.{method}.training", spec.methods[method].training),
              (f"scenarios.{scenario}.training", spec.scenarios[scenario].training)]
    return next((f"{where}.{key}" for where, layer in layers if key in layer), f"training.{key}")


def _check_training(spec: Spec, data: dict, scenario: str, method: str | None) -> list[str]:
    layers = [("training", spec.training.model_dump())]
    layers.append((f"scenarios.{scenario}.training", spec.scenarios[scenario].training))
    if method is not None:
        layers.append((f"methods.{method}.training", spec.methods[method].training))
    merged: dict[str, Any] = {}
    problems = []
    for where, layer in layers[1:]:
        for key in layer:
            if key not in TRAINING_KEYS:
                problems.append(f"{where}.{key}: unknown key; allowed: {', '.join(TRAINING_KEYS)}")
    if problems:
        return problems
    merged = merge_training([layer for _, layer in layers])
    try:
        training = Training(**merged)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = err["loc"][0] if err["loc"] else None
            if key is None:  # a rule across keys: blame the layer that set the local budget
                where = next((w for w, layer in reversed(layers)
                              if {"local_steps", "local_epochs"} & set(layer)), layers[0][0])
            else:
                where = next((w for w, layer in reversed(layers) if key in layer), layers[0][0])
            lines.append(_format_error(err, merged, where))
        return lines
    image_models = ("cnn", "cnn_tsdp", "resnet18")
    if training.model in image_models:
        from cflpipe.data.base import dataset_info

        dataset = spec.scenarios[scenario].dataset.name
        if _registered(dataset) and dataset_info(dataset).images is False:
            where = next((w for w, layer in reversed(layers) if "model" in layer), "training")
            return [f"{where}.model: {training.model} needs images, but scenario {scenario}'s dataset "
                    f"{dataset} has feature vectors; use mlp"]
    clients = spec.scenarios[scenario].clients
    if training.clients_per_round > clients:
        where = next((w for w, layer in reversed(layers) if "clients_per_round" in layer), "training")
        return [f"{where}.clients_per_round: must be <= clients of scenario {scenario} ({clients}), "
                f"got {training.clients_per_round}"]
    return []


def _registered(dataset: str) -> bool:
    """Unknown datasets are reported by the dataset check; here they are just skipped."""
    from cflpipe.data.base import dataset_info

    try:
        dataset_info(dataset)
    except SpecError:
        return False
    return True


def _check_method(spec: Spec, method: str) -> list[str]:
    from cflpipe.methods import METHODS, resolved_hyperparams, scenario_hyperparams, validate_method_entry

    entry = spec.methods[method]
    where = f"methods.{method}"
    origin = spec._sweeps.get(method)
    typed = entry.method and (origin is None or origin.typed)
    problems = validate_method_entry(spec.method_type(method), entry.hyperparams, where,
                                     f"{where}.method" if typed else where)
    if problems:
        return problems
    info = METHODS[spec.method_type(method)]
    capabilities = info.capabilities
    for scenario, sc in spec.scenarios.items():
        if not spec.runs_on(method, scenario):
            continue
        shared = scenario_hyperparams(spec, scenario, method)
        if not shared:
            continue
        # The values the method gets on this scenario, checked together (some rules span two
        # keys); a problem is reported where its key was written last.
        merged = {**shared, **entry.hyperparams}
        problems = validate_method_entry(spec.method_type(method), merged, where)
        scenario_where = f"scenarios.{scenario}.hyperparams"
        for key in shared:
            if key not in entry.hyperparams:
                problems = [line.replace(f"{where}.{key}:", f"{scenario_where}.{key}:") for line in problems]
        if problems:
            return problems
    if capabilities.k_param:
        # Uniform for every method with a number of clusters: K clusters need K clients.
        for scenario, sc in spec.scenarios.items():
            if not spec.runs_on(method, scenario):
                continue
            k = getattr(resolved_hyperparams(spec, scenario, method), capabilities.k_param)
            if k is not None and k > sc.clients:
                param = capabilities.k_param
                source = f"scenarios.{scenario}.hyperparams" \
                    if param in sc.hyperparams and param not in entry.hyperparams else where
                return [f"{source}.{param}: must be <= clients of scenario {scenario} "
                        f"({sc.clients}), got {k}"]
    if capabilities.needs_public:
        for scenario, sc in spec.scenarios.items():
            if spec.runs_on(method, scenario) and sc.public is None:
                return [f"{where}: {spec.method_type(method)} needs server-held public data, but scenario "
                        f"{scenario} has no `public:` (e.g. public: {{source: test, size: 500}} with pool: train)"]
    if capabilities.needs_groups:
        for scenario, sc in spec.scenarios.items():
            if spec.runs_on(method, scenario) and sc.group_step() is None:
                return [f"{where}: {spec.method_type(method)} needs ground-truth groups, but scenario "
                        f"{scenario} has none; list the scenarios it should run on in {where}.scenarios"]
    return []


def spec_warnings(spec: Spec) -> list[str]:
    """Things a valid spec asks for that make a result meaningless without being an error: a
    clustered method whose clustering starts at or after the run's last round stays one cluster
    (FedAvg) throughout. One line each, naming the key. Imports the methods (torch)."""
    from cflpipe.methods import method_info, resolved_hyperparams

    lines = []
    for method in spec.methods:
        cls = method_info(spec.method_type(method)).cls
        for scenario in spec.scenarios:
            if not spec.runs_on(method, scenario):
                continue
            start = cls.clustering_starts(resolved_hyperparams(spec, scenario, method))
            rounds = spec.resolved_training(scenario, method).rounds
            if start is not None and start[1] >= rounds:
                key, first = start
                value = getattr(resolved_hyperparams(spec, scenario, method), key)
                lines.append(f"methods.{method}.{key}: {value} leaves no round to cluster in the {rounds} rounds "
                             f"of scenario {scenario} (it may first cluster in round {first + 1}): {method} stays "
                             f"one cluster, FedAvg, throughout; lower it or raise training.rounds")
    return lines


def _check_scenario_hyperparams(spec: Spec) -> list[str]:
    """A scenario's `hyperparams` key that no method running on it takes, or that every such method
    overrides, would silently do nothing: an error, not a no-op."""
    from cflpipe.methods import method_info

    def info(name: str):
        try:  # unknown types and plugins that fail to load are reported by _check_method
            return method_info(spec.method_type(name))
        except (KeyError, SpecError):
            return None

    problems = []
    for scenario, sc in spec.scenarios.items():
        known: set[str] = set()
        used: set[str] = set()
        for name in spec.methods:
            if not spec.runs_on(name, scenario) or info(name) is None:
                continue
            has = set(info(name).params.model_fields)
            known |= has
            used |= has - set(spec.methods[name].hyperparams)
        for key in sc.hyperparams:
            if key not in known:
                problems.append(f"scenarios.{scenario}.hyperparams.{key}: no method of this scenario has this "
                                f"hyper-parameter; allowed: {', '.join(sorted(known)) or 'none'}")
            elif key not in used:
                problems.append(f"scenarios.{scenario}.hyperparams.{key}: every method of this scenario that has "
                                f"it sets its own value, so this one is never used; remove it")
    return problems


class DuplicateKeyError(yaml.YAMLError):
    pass


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader with two YAML 1.2 behaviours: a key repeated in one mapping is an
    error (PyYAML keeps the last value, so a second `methods:` block would silently replace the
    first), and `1e-3` is a number (YAML 1.1, which PyYAML follows, reads it as a string)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            # The mapping's own keys only: keys merged in with `<<` may be overridden here.
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    if key in first:
                        raise DuplicateKeyError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                                                f"(first at line {first[key]}); each key may appear once")
                    first[key] = key_node.start_mark.line + 1
                except TypeError:
                    pass  # an unhashable key: the base class reports it
        return super().construct_mapping(node, deep=deep)


UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def read_yaml(path: str | Path) -> Any:
    """A YAML file as the spec loader reads it (for tools that read a spec themselves)."""
    return yaml.load(Path(path).read_text(), Loader=UniqueKeyLoader)


def load_spec(path: str | Path, **kwargs: Any) -> Spec:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"--config: file {str(path)!r} does not exist")
    size = path.stat().st_size
    if size > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: {size} bytes; a spec is at most {MAX_SPEC_BYTES} bytes (1 MiB)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                        f"a spec is a YAML text file") from None
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)
    except DuplicateKeyError as exc:
        raise SpecError(f"{path}: {exc}") from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply to be a spec") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise SpecError(f"{path}: {problem}{where}") from None
    if isinstance(data, dict) and "results_dir" not in data:
        data = {**data, "results_dir": default_results_dir(path)}
    spec = parse_spec(data, **kwargs)
    spec._source = str(path)
    return spec


def default_results_dir(path: str | Path) -> str:
    """Where a spec file without `results_dir` writes: results/<its name without .yaml>."""
    return f"results/{Path(path).stem}"


def dump_yaml(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=None)


# Left out of a spec's hash: what it only shows (labels, description, report tables) and where it
# keeps files (results_dir, data_dir), so the same experiment has one hash wherever it runs; also
# what it keeps of finished runs (TRAINING_NOT_IN_RUN) and how the workflow cuts it into jobs.
SPEC_HASH_EXCLUDES = ("description", "report", "results_dir", "data_dir", "workflow")


def spec_sha256(spec: Spec) -> str:
    """The sha256 of the experiment a spec defines (seeds, training, scenarios, methods), as
    canonical JSON without cosmetic fields and paths (SPEC_HASH_EXCLUDES, labels)."""
    import hashlib
    import json

    data = spec.model_dump(mode="json", exclude=set(SPEC_HASH_EXCLUDES))
    for key in TRAINING_NOT_IN_RUN:
        data["training"].pop(key, None)
    for key in ("scenarios", "methods"):
        for entry in data[key].values():
            entry.pop("label", None)
            for name in TRAINING_NOT_IN_RUN:
                entry.get("training", {}).pop(name, None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def without_threads(config: dict) -> str:
    """A run's resolved config as text, less the torch thread count it ran with: what makes two
    runs the same run (threads change a run's bytes, not what the run is)."""
    return dump_yaml({k: v for k, v in config.items() if k != "threads"})
