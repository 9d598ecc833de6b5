"""The `Spec` model: the whole file (seeds, training, scenarios, methods, report and workflow
options), and how it resolves into runs: the run matrix, a run's training, its folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator

from cflpipe.spec._models import NAME_PATTERN, MethodEntry, Scenario, Strict, Training, merge_training
from cflpipe.spec._sweeps import SweepOrigin

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
