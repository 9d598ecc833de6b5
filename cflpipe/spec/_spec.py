"""The `Spec` model: the whole file (seeds, training, scenarios, methods, report and workflow
options), and how it resolves into runs: the run matrix, a run's training, its folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from cflpipe.spec._models import NAME_PATTERN, MethodEntry, Scenario, Strict, Training, merge_training
from cflpipe.spec._sweeps import SweepOrigin
from cflpipe.spec._tuning import ALL_METHODS, PROTOCOLS, MethodChoice, TuningOptions, Trial, expand_trials

# torch.manual_seed takes a signed 64-bit integer.
MAX_SEED = 2**63 - 1


# Figures of summary.parquet a paper table may show (report/aggregate.py's SUMMARY_FIGURES; the
# wall-clock seconds_per_round is a cost a paper reports too, not byte-reproducible), and those
# printed in percent by default.
TABLE_FIGURES = ("acc_macro", "acc_micro", "acc_worst10", "global_acc_mean", "f1_macro", "f1_micro", "ari",
                 "nmi", "n_clusters", "intra_acc", "inter_acc", "mixture_error", "bytes_down_total", "bytes_up_total",
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
    """`workflow:` — how Snakemake and DVC cut the spec's runs into jobs, and whether runs show
    their curves while they train. Changes no run."""

    # One process per job pays Python's and torch's start-up (2–3 s) once: per scenario, the
    # default spec's 156 runs are 4 jobs instead of 52 (2 min 48 s–3 min 12 s on 2 cores, against
    # 4 min 41 s per scenario × method and 8 min 18 s per run). Per method gives more, shorter
    # jobs: a cluster runs long runs in parallel.
    train_jobs: Literal["scenario", "method"] = Field(
        "scenario", description="one training job per scenario (every method × seed of it, one after the other) "
                                "or per scenario × method (every seed of it)")
    live: bool = Field(False, description="write each run's curves as it trains (RESULTS/live/, for `tensorboard "
                                          "--logdir RESULTS/live`); costs a few seconds per job")


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
    tuning: TuningOptions | None = Field(None, description="hyper-parameters searched on validation data before the "
                                                            "final seeds run with the chosen values")
    protocol: Literal[PROTOCOLS] | None = Field(  # type: ignore[valid-type]
        None, description="how the methods' hyper-parameters were set, said in the report: shared (the spec's "
                          "values for every method), paper (each method's published settings) or tuned (`tuning:`)")
    # {expanded entry: the `sweep:` entry it comes from}; not a field, so no dump or hash sees it.
    _sweeps: dict[str, SweepOrigin] = PrivateAttr(default_factory=dict)
    # The file the spec was read from (load_spec), for the report to say which spec it covers.
    _source: str | None = PrivateAttr(None)
    # {(scenario, method entry): the values its tuning chose}: None until with_tuning_choices() read
    # them (what the workflow's own process and `validate` see: the spec as written).
    _chosen: dict[tuple[str, str], MethodChoice] | None = PrivateAttr(None)
    # Where a tuning view (tuning_spec) finds the partitions: the final spec's, shared.
    _partitions_root: str | None = PrivateAttr(None)
    _trials: dict[str, list[Trial]] = PrivateAttr(default_factory=dict)
    _tuning_view: "Spec | None" = PrivateAttr(None)

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

    @model_validator(mode="after")
    def _tuning_fits(self) -> "Spec":
        if self.tuning is not None:
            final = sorted(set(self.tuning.seeds) & set(self.seeds))
            if final:
                raise ValueError(f"@tuning.seeds: {final[0]} is also a final seed (seeds); tuning seeds must differ "
                                 f"from the seeds the results are reported on")
            for entry in self.tuning.space:
                if entry != ALL_METHODS and entry not in self.methods:
                    raise ValueError(f"@tuning.space.{entry}: not a method entry; allowed: {ALL_METHODS}, "
                                     f"{', '.join(self.methods)}")
        if self.protocol == "tuned" and self.tuning is None:
            raise ValueError("@protocol: 'tuned' needs a tuning: section (what was tuned, on which seeds)")
        if self.tuning is not None and self.protocol not in (None, "tuned"):
            raise ValueError(f"@protocol: {self.protocol!r}, but the spec has a tuning: section; a spec that tunes "
                             f"says protocol: tuned")
        return self

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
                                          self.methods[method].training, self.chosen(scenario, method).training]))

    # ------------------------------------------------------------------ tuning

    def tuned_methods(self) -> list[str]:
        """The method entries `tuning.space` gives a search space, in the spec's order."""
        if self.tuning is None:
            return []
        return [m for m in self.methods if self.tuning.keys_of(m)]

    def trials(self, method: str) -> list[Trial]:
        """The trials of a tuned method entry ([] for one that is not tuned)."""
        if self.tuning is None:
            return []
        if method not in self._trials:
            self._trials[method] = expand_trials(self.tuning, method)
        return self._trials[method]

    def tuning_matrix(self) -> list[tuple[str, str, str, int]]:
        """Every (scenario, method, trial, tuning seed) trial run, in a stable order."""
        if self.tuning is None:
            return []
        return [(s, m, t.name, k) for s in self.scenarios for m in self.tuned_methods() if self.runs_on(m, s)
                for t in self.trials(m) for k in self.tuning.seeds]

    @property
    def tuning_dir(self) -> Path:
        return Path(self.results_dir) / "tuning"

    def chosen_path(self, scenario: str, method: str) -> Path:
        """Where the selection of a tuned method on a scenario is written (cflpipe.tuning)."""
        return self.tuning_dir / "chosen" / scenario / f"{method}.json"

    def tuning_spec(self) -> "Spec":
        """The trials as a spec of their own: one method entry `METHOD/TRIAL` per trial (the entry with
        the trial's values), the tuning seeds, results under RESULTS/tuning/ (a trial's run folder is
        RESULTS/tuning/runs/SCENARIO/METHOD/TRIAL/seedK) and the final spec's partitions."""
        assert self.tuning is not None
        if self._tuning_view is not None:
            return self._tuning_view
        methods = {}
        for method in self.tuned_methods():
            entry = self.methods[method]
            for trial in self.trials(method):
                training = dict(entry.training)
                for key, other in (("local_steps", "local_epochs"), ("local_epochs", "local_steps")):
                    if key in trial.training:
                        training.pop(other, None)
                # A trial is judged on validation data alone: it evaluates no test split at all.
                methods[self.trial_entry(method, trial.name)] = MethodEntry(
                    method=self.method_type(method), training={**training, **trial.training, "eval_test": False},
                    scenarios=entry.scenarios, label=f"{self.method_label(method)} ({trial.text})",
                    **{**entry.hyperparams, **trial.hyperparams})
        view = self.model_copy(update={"methods": methods, "seeds": list(self.tuning.seeds), "tuning": None,
                                       "results_dir": str(self.tuning_dir)})
        view._partitions_root = self._partitions_root or self.results_dir
        view._trials, view._chosen, view._sweeps, view._tuning_view = {}, None, {}, None
        self._tuning_view = view
        return view

    def trial_entry(self, method: str, trial: str) -> str:
        return f"{method}/{trial}"

    def with_tuning_choices(self) -> "Spec":
        """This spec with every tuned method's chosen values read from its chosen files (those
        missing are an error when a run needs them: `chosen`)."""
        from cflpipe.spec._tuning import read_choice

        spec = self.model_copy()
        spec._chosen = {}
        for scenario in self.scenarios:
            for method in self.tuned_methods():
                path = self.chosen_path(scenario, method)
                if self.runs_on(method, scenario) and path.is_file():
                    spec._chosen[(scenario, method)] = read_choice(path)
        return spec

    def chosen(self, scenario: str, method: str) -> MethodChoice:
        """The values tuning chose for a method entry on a scenario (none for one not tuned, or
        before with_tuning_choices)."""
        if self._chosen is None or self.tuning is None or not self.tuning.keys_of(method):
            return MethodChoice()
        choice = self._chosen.get((scenario, method))
        if choice is None:
            from cflpipe.errors import SpecError

            raise SpecError(f"{self.chosen_path(scenario, method)}: missing; methods.{method} is tuned "
                            f"(tuning.space), so its runs on {scenario} need their trials and selection first: "
                            f"`cflpipe tune` and `cflpipe tune-select` (snakemake runs both)")
        current = {"rule": self.tuning.select, "tuning_seeds": list(self.tuning.seeds),
                   "trials": {t.name: t.values for t in self.trials(method)}}
        if choice.made_over != current:
            from cflpipe.errors import SpecError

            stale = next(key for key in current if (choice.made_over or {}).get(key) != current[key])
            raise SpecError(f"{self.chosen_path(scenario, method)}: stale: selected over other {stale.replace('_', ' ')} "
                            f"than tuning: now gives; run `cflpipe tune` and `cflpipe tune-select` again (snakemake "
                            f"does)")
        return choice

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
        return Path(self._partitions_root or self.results_dir) / "partitions" / scenario
