"""A read-only view over one spec's aggregate tables (`results/aggregate/`, from `cflpipe
aggregate`) and its scenarios' partition stats: the queries the report's figures and sections ask
(which methods ran where, summary rows, per-round curves, clusters formed, scores to rank by,
hyper-parameter sweeps). Nothing here draws or formats."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cflpipe import store
from cflpipe.report.aggregate import per_seed_frame
from cflpipe.report.styles import assign_styles, family_order
from cflpipe.report.tables import is_clustered, is_reference
from cflpipe.spec import Spec, Training, merge_training

# The figure methods are ranked by across scenarios (mean over seeds; higher is better).
RANK_FIGURE, RANK_FIGURE_TITLE = "acc_macro", "personalized accuracy (acc macro)"
# Hyper-parameters named here are swept first and titled with their symbol.
SWEEP_SYMBOLS = {"beta": "β", "mu": "μ", "alpha": "α", "lambda": "λ", "lam": "λ", "tau": "τ"}


class AggregateView:
    """One spec's aggregate tables (runs, curves, summary, timing, final clients), the partition
    stats of its scenarios, and its methods' labels, types and styles; queries never change them."""

    def __init__(self, spec: Spec, tables: dict[str, pd.DataFrame]):
        self.spec = spec
        self.runs, self.curves, self.summary, self.timing, self.final_clients = (
            tables[k] for k in ("runs", "curves", "summary", "timing", "final_clients"))
        self.per_seed = per_seed_frame(self.runs, self.timing)
        self.methods = list(spec.methods)
        self.method_labels = {m: spec.method_label(m) for m in self.methods}
        self.scenario_labels = {s: spec.scenario_label(s) for s in spec.scenarios}
        self.method_types = {m: spec.method_type(m) for m in self.methods}
        # Assigned once for the whole spec: a method keeps its style in every figure.
        self.styles = assign_styles([(m, self.method_types[m]) for m in self.methods])
        self.color = {m: s.color for m, s in self.styles.items()}
        self.stats = {s: self._stats(s) for s in spec.scenarios}
        self._clustered: dict[str, list[str]] = {}
        self._summary_rows = {(r["scenario"], r["method"]): r for _, r in self.summary.iterrows()}
        # {(scenario, tuned method): its selection (cflpipe.tuning's chosen file)}
        self.tuning = {(s, m): json.loads(spec.chosen_path(s, m).read_text())
                       for s in spec.scenarios for m in spec.tuned_methods()
                       if spec.runs_on(m, s) and spec.chosen_path(s, m).is_file()}

    def _stats(self, scenario: str) -> pd.DataFrame | None:
        path = self.spec.partition_dir(scenario) / "stats.parquet"
        return store.read_parquet(path) if path.is_file() else None

    def methods_on(self, scenario: str) -> list[str]:
        present = set(self.summary.loc[self.summary["scenario"] == scenario, "method"])
        return [m for m in self.methods if m in present]

    def plot_order(self, methods: list[str]) -> list[str]:
        """Traces (and so legend entries) grouped by method family."""
        return family_order(methods, self.styles)

    def label(self, method: str) -> str:
        return self.spec.method_label(method)

    def has_groups(self, scenario: str) -> bool:
        stats = self.stats[scenario]
        if stats is not None:
            return bool((stats["group"] >= 0).any())
        return bool(self.spec.scenarios[scenario].true_groups)

    def summary_row(self, scenario: str, method: str) -> pd.Series | None:
        return self._summary_rows.get((scenario, method))

    def curve(self, scenario: str, method: str, figure: str, eval_only: bool = True) -> pd.DataFrame | None:
        rows = self.curves[(self.curves["scenario"] == scenario) & (self.curves["method"] == method)]
        if f"{figure}_mean" not in rows.columns or not len(rows):
            return None
        if eval_only:
            rows = rows[np.isfinite(rows[f"{figure}_mean"].to_numpy(dtype=float))]
        return rows if len(rows) else None

    def max_clusters(self, scenario: str, method: str) -> float:
        """Most clusters in any evaluated round: the mean over seeds per round, and each seed's final."""
        rows = self.runs[(self.runs["scenario"] == scenario) & (self.runs["method"] == method)]
        values = list(rows["n_clusters"].to_numpy(dtype=float))
        curve = self.curve(scenario, method, "n_clusters")
        if curve is not None:
            values += list(curve["n_clusters_mean"].to_numpy(dtype=float))
        values = [v for v in values if math.isfinite(v)]
        return max(values) if values else 0.0

    def clustered_methods(self, scenario: str) -> list[str]:
        """Methods with more than one cluster in some evaluated round."""
        if scenario not in self._clustered:
            self._clustered[scenario] = [m for m in self.methods_on(scenario) if self.max_clusters(scenario, m) > 1]
        return self._clustered[scenario]

    def largest(self, scenario: str, figure: str) -> float:
        """The largest per-round mean of `figure` of any method on `scenario` (0 when none)."""
        rows = self.curves[self.curves["scenario"] == scenario] if len(self.curves) else self.curves
        if f"{figure}_mean" not in rows.columns:
            return 0.0
        values = rows[f"{figure}_mean"].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        return float(values.max()) if len(values) else 0.0

    def client_accuracy(self, scenario: str, method: str) -> pd.Series:
        """Each client's final test accuracy (%), mean over seeds; clients without test samples left out."""
        rows = self.final_clients[(self.final_clients["scenario"] == scenario) & (self.final_clients["method"] == method)
                                  & (self.final_clients["n"] > 0)]
        return rows.groupby("client", sort=True)["acc"].mean() * 100

    def rank_scores(self) -> tuple[pd.DataFrame, dict[str, str]]:
        """scenarios × methods means of RANK_FIGURE over seeds, and the methods left out and why."""
        scenarios = list(self.spec.scenarios)
        ran = [m for m in self.methods if any(m in self.methods_on(s) for s in scenarios)]
        excluded = {m: "reference (told the true groups)" for m in ran if is_reference(self.method_types[m])}
        for m in ran:
            missing = [self.scenario_labels[s] for s in scenarios if m not in self.methods_on(s)]
            if missing and m not in excluded:
                excluded[m] = f"not run on {', '.join(missing)}"
        scores = pd.DataFrame({m: [float(self.summary_row(s, m)[f"{RANK_FIGURE}_mean"]) if m in self.methods_on(s)
                                   else math.nan for s in scenarios] for m in ran}, index=scenarios, dtype="float64")
        for m in ran:
            undefined = [self.scenario_labels[s] for s in scenarios if m in self.methods_on(s)
                         and not math.isfinite(scores.loc[s, m])]
            if undefined and m not in excluded:  # e.g. every seed diverged there
                excluded[m] = f"no {RANK_FIGURE} on {', '.join(undefined)}"
        return scores, excluded

    def scenario_training(self, scenario: str) -> Training:
        """The training settings of a scenario before any method's overrides."""
        return Training(**merge_training([self.spec.training.model_dump(), self.spec.scenarios[scenario].training]))

    def clustering_methods(self) -> list[str]:
        """ARI table rows: methods that declare they cluster (those that never did are marked in
        the table, not dropped) or that had more than one cluster in some scenario."""
        return [m for m in self.methods if is_clustered(self.method_types[m])
                or any(m in self.clustered_methods(s) for s in self.spec.scenarios)]

    def never_clustered(self, scenario: str) -> list[str]:
        """One line per method whose clustering, in some seed, came to none (summary.json's
        `degenerate`: one cluster throughout or at the end, one per client, a gate that kept it
        from clustering), with the runs' own reasons."""
        if "degenerate" not in self.runs.columns:
            return []
        rows = self.runs[(self.runs["scenario"] == scenario) & (self.runs["degenerate"].fillna("") != "")]
        lines = []
        for m in self.methods_on(scenario):
            mine = rows[rows["method"] == m]
            if len(mine):
                seeds = int((self.runs["scenario"].eq(scenario) & self.runs["method"].eq(m)).sum())
                reasons = "; ".join(sorted(set(mine["degenerate"])))
                lines.append(f"{self.label(m)}: no clustering in {len(mine)} of {seeds} seeds ({reasons}): its "
                             f"figures there are not those of a clustering")
        return lines


@dataclass(frozen=True)
class Sweep:
    scenario: str
    method_type: str
    param: str
    values: tuple[float, ...]
    methods: tuple[str, ...]

    @property
    def symbol(self) -> str:
        return SWEEP_SYMBOLS.get(self.param, self.param)


def find_sweeps(summary: pd.DataFrame, spec: Spec) -> list[Sweep]:
    """Methods of one type that differ only in one numeric hyper-parameter (their resolved
    `hyperparams` from config.yaml, and the same training overrides), per scenario; β first."""
    sweeps = []
    for scenario in spec.scenarios:
        rows = summary[summary["scenario"] == scenario]
        by_type: dict[str, list[tuple[str, dict]]] = {}
        for r in rows.itertuples(index=False):
            by_type.setdefault(r.method_type, []).append((r.method, json.loads(r.hyperparams)))
        for method_type, entries in by_type.items():
            params = sorted({k for _, hp in entries for k in hp}, key=lambda p: (p not in SWEEP_SYMBOLS, p != "beta", p))
            for param in params:
                groups: dict[str, list[tuple[float, str]]] = {}
                for method, hp in entries:
                    value = hp.get(param)
                    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                        continue
                    rest = {k: v for k, v in hp.items() if k != param}
                    # resolved: tuned entries whose chosen training differs are no sweep
                    key = json.dumps([rest, spec.resolved_training(scenario, method).definition()], sort_keys=True,
                                     default=str)
                    groups.setdefault(key, []).append((float(value), method))
                for members in groups.values():
                    if len({v for v, _ in members}) >= 2 and len({v for v, _ in members}) == len(members):
                        members.sort()
                        sweeps.append(Sweep(scenario, method_type, param, tuple(v for v, _ in members),
                                            tuple(m for _, m in members)))
    sweeps.sort(key=lambda sw: (sw.param != "beta",))  # stable: β sweeps first, then spec order
    return sweeps
