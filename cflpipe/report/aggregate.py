"""Mean ± std over seeds of every finished run of a spec (`cflpipe aggregate`).

Reads each run's summary.json, rounds.parquet, config.yaml and timing.json (never re-trains) and
writes `results/aggregate/`, every file atomically:

- `runs.parquet`     one row per run: scenario, method, method_type, seed, hyperparams (JSON),
                     rounds, clients, the final evaluation figures, best_acc_macro (the best round
                     selected on validation data) or best_test_acc_macro (selected on test data, where
                     the scenario has no validation split), bytes totals, and summary.json's
                     provenance (cflpipe/torch/python versions, requested device, config hash; ""
                     for runs written before it existed).
- `curves.parquet`   scenario × method × round: `<figure>_mean`/`<figure>_std` over seeds of
                     every per-round figure of rounds.parquet (evaluation figures are null on
                     non-evaluation rounds; `eval` says which rounds were evaluated), and of
                     `bytes_cumulative`: the bytes sent both ways up to and including the round.
- `final_clients.parquet`
                     one row per run × client: the client's test accuracy, loss and number of
                     test samples at the run's final evaluation (metrics.parquet; the mean of
                     `acc` over clients with test samples is the run's acc_macro).
- `summary.parquet`, `summary.csv`
                     scenario × method: `<figure>_mean`/`<figure>_std` of the final figures
                     (SUMMARY_FIGURES), `seeds` (how many runs were averaged).
- `metrics.json`     the headline for DVC (`dvc metrics show`, `dvc exp show`): per scenario ×
                     method the seeds' mean of the final personalized accuracy (`acc`), ARI
                     (`ari`, with ground-truth groups) and clusters (`clusters`), and where a
                     scenario has them the new clients' accuracy and share placed with their
                     group (`new_acc`, `new_joined`) and the moved clients' (`moved_acc`,
                     `moved_joined`, `rounds_to_place`), as {scenario: {method: {figure:
                     value}}}, no wall-clock figure. Kept small so an
                     experiment table stays readable; summary.csv has every figure and the time.
- `trainer-choices.json`  the record of `trainer: auto`'s choices (results/trainer-choices.json,
                     which the runs write) for the shapes the spec's runs trained: copied back
                     into a results folder, it reruns every run with the trainer it was trained
                     with, to the same bytes, on any machine.
- `plots.csv`        personalized accuracy per evaluated round, a column `<scenario>/<method>`
                     each (the seeds' mean; empty where that run was not evaluated).
- `plots/<scenario>.csv`  the same per scenario, a column per method of the spec (empty where
                     it does not run on that scenario): what dvc.yaml's `plots` draws, one plot
                     per scenario (`dvc plots show`, `dvc plots diff` of experiments).
- `timing.parquet`   one row per run: seconds_total, seconds_per_round, server_seconds_per_round,
                     device, finished_utc, git_commit, git_dirty, spec_sha256 (wall-clock figures and where and
                     when the run finished, from timing.json).

Everything but the wall-clock columns is a pure function of the runs' deterministic outputs, so
the same runs give the same bytes: `runs.parquet` and `curves.parquet` hold no wall-clock figure;
`summary.*` carry `seconds_per_round` figures (the only columns that change when a run is
re-trained with the same seed) and `timing.parquet` holds the per-run wall-clock figures.

Std is the sample std over seeds (ddof = 1, what a paper reports as "± std" over n runs), taken
over the seeds where the figure is defined (ARI/NMI are null without ground-truth groups); with a
single seed it is null (empty in the CSV), not 0.
"""

from __future__ import annotations

import hashlib
import math
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from cflpipe import store
from cflpipe.errors import CflpipeError
from cflpipe.fl.axes import scenario_axes
from cflpipe.spec import Spec, without_threads

STD_DDOF = 1
AGGREGATE_FILES = ("runs.parquet", "curves.parquet", "summary.parquet", "summary.csv", "timing.parquet",
                   "metrics.json", "plots.csv", "final_clients.parquet", "trainer-choices.json")
# metrics.json's figures: its name there ← the summary's column (the mean over seeds).
# No wall-clock figure: an experiment table compares what the runs computed (a rerun's seconds
# differ, and would show every finished run as changed); seconds stay in summary.csv.
# The evaluation axes' final figures (scenario keys new_clients and drift; NaN where a scenario has
# none): new clients' accuracy and share placed with their group, the moved clients' accuracy at the
# end, share placed with their new group, and rounds trained after a move until first so placed.
# The keyed axes' (fl/axes SCENARIO_AXES) come from summary.json under each axis's name.
KEYED_AXIS_FIGURES = {figure: axis.name for axis in scenario_axes().values() for figure in axis.figures}
AXIS_FIGURES = ("new_acc_macro", "new_joined", "moved_acc_macro", "drift_joined", "rounds_to_place",
                *KEYED_AXIS_FIGURES)
HEADLINE_FIGURES = {"acc": "acc_macro_mean", "ari": "ari_mean", "clusters": "n_clusters_mean",
                    "new_acc": "new_acc_macro_mean", "new_joined": "new_joined_mean",
                    "moved_acc": "moved_acc_macro_mean", "moved_joined": "drift_joined_mean",
                    "rounds_to_place": "rounds_to_place_mean",
                    **{figure: f"{figure}_mean" for figure in KEYED_AXIS_FIGURES}}
# The figure drawn per round in plots.csv.
PLOTTED_FIGURE = "acc_macro_mean"

# Final evaluation figures (summary.json's `final`) always present in runs.parquet, in this order;
# a method's own scalar figures follow, sorted by name.
FINAL_FIGURES = ("acc_macro", "acc_micro", "acc_std", "acc_worst10", "loss", "train_loss", "f1_macro",
                 "f1_micro", "train_acc_macro", "global_acc_mean", "global_acc_std", "intra_acc",
                 "inter_acc", "n_clusters", "models", "ari", "nmi", "ami")
# Keys of `final` that are bookkeeping, not figures.
_NOT_FIGURES = {"round", "sampled", "skipped", "bytes_down", "bytes_up", "global_models"}
TOTALS = ("bytes_down_total", "bytes_up_total", "bytes_total")
# Figures averaged over seeds into summary.parquet (`<name>_mean`, `<name>_std`).
SUMMARY_FIGURES = ("acc_macro", "acc_micro", "acc_worst10", "global_acc_mean", "f1_macro", "f1_micro",
                   "ari", "nmi", "n_clusters", "intra_acc", "inter_acc", "mixture_error", "bytes_down_total",
                   "bytes_up_total", "bytes_total", "seconds_per_round", *AXIS_FIGURES)
TIMING_FIGURES = ("seconds_total", "seconds_per_round", "server_seconds_per_round")
# runs.parquet columns from summary.json's `provenance` (deterministic: what made the run).
PROVENANCE_COLUMNS = {"cflpipe_version": "cflpipe", "torch_version": "torch", "python_version": "python",
                      "device_requested": "device_requested", "config_sha256": "config_sha256"}
# rounds.parquet columns that are not averaged into curves.parquet.
_NOT_CURVES = {"round", "sampled", "skipped", "global_models"}
# final_clients.parquet: metrics.parquet's test rows of the final evaluation round.
FINAL_CLIENT_COLUMNS = ("client", "group", "model", "acc", "loss", "n")


def trainer_choices(spec: Spec, runs: list["RunOutputs"]) -> dict:
    """The record of trainer: auto's choices, for the shapes the spec's runs trained (their
    timing.json): copied back into a results folder, it reruns each of them with its trainer, to
    the same bytes, on any machine. A shape the record lacks (a run whose record was deleted)
    keeps the trainer its run names."""
    from cflpipe.fl.runs import TRAINER_CHOICES
    from cflpipe.fl.trainer_choice import read_choices, shared_record

    record = read_choices(shared_record(Path(spec.results_dir) / TRAINER_CHOICES), results=True)
    used = {shape: choice.get("trainer") for r in runs for shape, choice in (r.timing.get("auto_choices") or {}).items()}
    return {shape: record.get(shape, {"trainer": trainer}) for shape, trainer in sorted(used.items())}


def aggregate_dir(spec: Spec) -> Path:
    return Path(spec.results_dir) / "aggregate"


def aggregate(spec: Spec) -> Path:
    """Aggregate every run of `spec.matrix()` into `results/aggregate/`; returns that folder.
    Raises CflpipeError (one line) when a run is missing, unfinished or trained with another spec."""
    runs = load_runs(spec)
    out = aggregate_dir(spec)
    tables = build_tables(spec, runs)
    store.write_parquet(out / "runs.parquet", tables["runs"])
    store.write_parquet(out / "curves.parquet", tables["curves"])
    store.write_parquet(out / "timing.parquet", tables["timing"])
    store.write_parquet(out / "final_clients.parquet", tables["final_clients"])
    store.write_parquet(out / "summary.parquet", tables["summary"])
    store.write_text(out / "summary.csv", tables["summary"].to_csv(index=False, float_format="%.10g",
                                                                    na_rep="", lineterminator="\n"))
    store.write_text(out / "metrics.json", json.dumps(metrics_tree(tables["summary"]), indent=1) + "\n")
    store.write_text(out / "trainer-choices.json", json.dumps(trainer_choices(spec, runs), indent=1, sort_keys=True))
    store.write_text(out / "plots.csv", plots_table(tables["curves"]).to_csv(
        index=False, float_format="%.6g", na_rep="", lineterminator="\n"))
    plots = scenario_plots(spec, tables["curves"])
    for stale in (out / PLOTS_DIR).glob("*.csv") if (out / PLOTS_DIR).is_dir() else ():
        if stale.stem not in plots:  # a scenario no longer in the spec: DVC would draw it
            stale.unlink()
    for scenario, table in plots.items():
        store.write_text(out / PLOTS_DIR / f"{scenario}.csv", table.to_csv(
            index=False, float_format="%.6g", na_rep="", lineterminator="\n"))
    return out


def plot_columns(pairs) -> list[str]:
    """plots.csv's column of each (scenario, method): dvc.yaml's plot names them (dvc-runs.yaml)."""
    return [f"{scenario}/{method}" for scenario, method in pairs]


def metrics_tree(summary: pd.DataFrame) -> dict:
    """The headline figures (HEADLINE_FIGURES) as {scenario: {method: {figure: value}}}: what `dvc
    metrics show` and `dvc exp show` read (DVC reads JSON, not Parquet). A figure a row lacks (ARI
    without ground truth) is left out; 4 decimals, so an experiment table stays narrow."""
    tree: dict = {}
    for row in summary.to_dict("records"):
        figures = {name: round(float(row[column]), 4) for name, column in HEADLINE_FIGURES.items()
                   if isinstance(row.get(column), (int, float, np.integer, np.floating))
                   and math.isfinite(row[column])}
        tree.setdefault(row["scenario"], {})[row["method"]] = figures
    return tree


# One CSV per scenario under it: DVC draws a directory's files as a plot each.
PLOTS_DIR = "plots"


def plotted_methods(spec: Spec) -> list[str]:
    """The methods the per-scenario plots have a column for: every method of the spec that runs
    on some scenario, in the spec's order (dvc.yaml's plot names them, dvc-runs.yaml)."""
    return list(dict.fromkeys(m for _, m, _ in spec.matrix()))


def scenario_plots(spec: Spec, curves: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per scenario: evaluated rounds × every plotted method of the seeds' mean personalized
    accuracy (a column of blanks for a method that does not run there: DVC asks every file of a
    directory plot for the same columns)."""
    wide = plots_table(curves)
    out = {}
    for scenario in spec.scenarios:
        columns = {"round": wide["round"]}
        for method in plotted_methods(spec):
            name = plot_columns([(scenario, method)])[0]
            columns[method] = wide[name] if name in wide else pd.Series(np.nan, index=wide.index)
        table = pd.DataFrame(columns)
        out[scenario] = table[table.drop(columns="round").notna().any(axis=1)].reset_index(drop=True)
    return out


def plots_table(curves: pd.DataFrame) -> pd.DataFrame:
    """Evaluated rounds × `<scenario>/<method>` of the seeds' mean personalized accuracy."""
    if curves.empty:
        return pd.DataFrame({"round": pd.Series([], dtype="int64")})
    evaluated = curves[curves["eval"]]
    wide = evaluated.pivot_table(index="round", columns=["scenario", "method"], values=PLOTTED_FIGURE,
                                 sort=False, dropna=False)
    pairs = list(dict.fromkeys(zip(curves["scenario"], curves["method"])))
    wide = wide.reindex(columns=pd.MultiIndex.from_tuples(pairs)).sort_index()
    wide.columns = plot_columns(pairs)
    return wide.reset_index()


# --------------------------------------------------------------------------- reading runs


class RunOutputs:
    """The outputs of one finished run that aggregation needs."""

    def __init__(self, scenario: str, method: str, seed: int, run_dir: Path, summary: dict,
                 rounds: pd.DataFrame, config: dict, timing: dict, summary_sha256: str = "",
                 final_clients: pd.DataFrame | None = None):
        self.scenario, self.method, self.seed, self.run_dir = scenario, method, seed, run_dir
        self.summary, self.rounds, self.config, self.timing = summary, rounds, config, timing
        self.summary_sha256 = summary_sha256
        self.final_clients = final_clients if final_clients is not None else \
            pd.DataFrame({c: [] for c in FINAL_CLIENT_COLUMNS})


def _train_hint(scenario: str, method: str, seed: int) -> str:
    return (f"run `cflpipe train --config FILE --scenario {scenario} --method {method} --seed {seed}` "
            f"(or snakemake) first")


def missing_runs(spec: Spec) -> list[tuple[str, str, int]]:
    """Runs of the matrix without a summary.json (the engine writes it last)."""
    return [(s, m, k) for s, m, k in spec.matrix() if not (spec.run_dir(s, m, k) / "summary.json").is_file()]


def load_runs(spec: Spec, check_config: bool = True) -> list[RunOutputs]:
    missing = missing_runs(spec)
    if missing:
        s, m, k = missing[0]
        more = f" ({len(missing) - 1} more runs of the spec are missing too)" if len(missing) > 1 else ""
        raise CflpipeError(f"{spec.run_dir(s, m, k)}: run not finished (no summary.json); "
                           f"{_train_hint(s, m, k)}{more}")
    runs = []
    stale = []
    for s, m, k in spec.matrix():
        d = spec.run_dir(s, m, k)
        for name in ("rounds.parquet", "metrics.parquet", "config.yaml"):
            if not (d / name).is_file():
                raise CflpipeError(f"{d}: {name} is missing although summary.json exists; re-run "
                                   f"`cflpipe train --config FILE --scenario {s} --method {m} --seed {k} --force`")
        try:
            summary_bytes = (d / "summary.json").read_bytes()
            summary = json.loads(summary_bytes)
            config_text = (d / "config.yaml").read_text()
            config = yaml.safe_load(config_text)
            rounds = store.read_parquet(d / "rounds.parquet")
            final_clients = _final_clients(store.read_parquet(d / "metrics.parquet"), summary)
            timing = json.loads((d / "timing.json").read_text()) if (d / "timing.json").is_file() else {}
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise CflpipeError(f"{d}: cannot read the run's outputs ({type(exc).__name__}: {exc}); re-run "
                               f"`cflpipe train --config FILE --scenario {s} --method {m} --seed {k} --force`")
        if check_config and (not isinstance(config, dict) or without_threads(config) != _expected_config(spec, s, m, k)):
            stale.append((s, m, k))
        runs.append(RunOutputs(s, m, k, d, summary, rounds, config, timing, _sha256(summary_bytes), final_clients))
    if stale:
        s, m, k = stale[0]
        more = f" ({len(stale) - 1} more runs are stale too)" if len(stale) > 1 else ""
        raise CflpipeError(f"{spec.run_dir(s, m, k)}: config.yaml differs from what the spec asks for now "
                           f"(the spec changed since it was trained); {_train_hint(s, m, k)}{more}")
    return runs


def _final_clients(metrics: pd.DataFrame, summary: dict) -> pd.DataFrame:
    """Each client's test figures at the run's final evaluation round (summary.json's final round)."""
    final = _float((summary.get("final") or {}).get("round"))
    rows = metrics[(metrics["split"] == "test") & (metrics["round"] == final)] if math.isfinite(final) else metrics[:0]
    return rows.loc[:, list(FINAL_CLIENT_COLUMNS)].sort_values("client", kind="stable").reset_index(drop=True)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _expected_config(spec: Spec, scenario: str, method: str, seed: int) -> str:
    # The engine's own resolution, so "stale" means what `cflpipe train` would re-run (whatever
    # the thread count it ran with: that changes bytes, not what the run is).
    from cflpipe.fl.runs import resolved_config

    return without_threads(resolved_config(spec, scenario, method, seed))


# --------------------------------------------------------------------------- tables


def _float(value: Any) -> float:
    if value is None or isinstance(value, (list, dict, str, bool)):
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _is_scalar_figure(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _diagnosed(spec: Spec, r: RunOutputs):
    """fl/diagnosis of a finished run from its rounds table, for a run whose summary predates
    it (its own gate, read by the method's class, is left to the summary it wrote)."""
    from cflpipe.fl.diagnosis import diagnose_clustering
    from cflpipe.registry import method_info

    capabilities = method_info(spec.method_type(r.method)).capabilities
    k = capabilities.k_param and r.config.get("hyperparams", {}).get(capabilities.k_param)
    if not capabilities.clustered or capabilities.needs_groups or k == 1 or r.summary.get("degenerate"):
        return None
    return diagnose_clustering(r.rounds, int(r.summary.get("clients", 0)),
                               true_groups=spec.scenarios[r.scenario].true_groups, soft=capabilities.soft)


def _rounds_to_place(events: list[dict] | None) -> float:
    """The mean over every moved client the method placed with its new group of the rounds it
    trained after its move until first so placed (summary.json's `drift`); NaN where none was
    placed or the scenario moves none (drift_joined says how many were)."""
    placed = [r for event in events or [] for r in event.get("rounds_to_place", []) if r is not None]
    return float(np.mean(placed)) if placed else math.nan


def runs_frame(spec: Spec, runs: list[RunOutputs]) -> pd.DataFrame:
    extra = sorted({k for r in runs for k, v in r.summary.get("final", {}).items()
                    if k not in FINAL_FIGURES and k not in _NOT_FIGURES and _is_scalar_figure(v)})
    figures = list(FINAL_FIGURES) + extra
    rows = []
    for r in runs:
        final = r.summary.get("final", {})
        down, up = r.summary.get("bytes_down_total"), r.summary.get("bytes_up_total")
        row: dict[str, Any] = {
            "scenario": r.scenario, "method": r.method, "method_type": spec.method_type(r.method),
            "seed": r.seed, "hyperparams": _canonical(r.config.get("hyperparams", {})),
            "rounds": int(r.summary.get("rounds", len(r.rounds))), "clients": int(r.summary.get("clients", 0)),
            "final_round": _float(final.get("round")),
        }
        row.update({f: _float(final.get(f)) for f in figures})
        row["rounds_to_place"] = _rounds_to_place(r.summary.get("drift"))
        row.update({f: _float((r.summary.get(axis) or {}).get(f)) for f, axis in KEYED_AXIS_FIGURES.items()})
        # The best round chosen on validation data (best_acc_macro: its test figure), or, without
        # a validation split, on the test data itself (best_test_acc_macro; a summary written
        # before the split existed called that best_acc_macro).
        on_validation = r.summary.get("best_selected_on") == "validation"
        row["best_acc_macro"] = _float(r.summary.get("best_acc_macro")) if on_validation else math.nan
        row["best_test_acc_macro"] = math.nan if on_validation else _float(
            r.summary.get("best_test_acc_macro", r.summary.get("best_acc_macro")))
        row["best_round"] = _float(r.summary.get("best_round"))
        row["bytes_down_total"] = _float(down)
        row["bytes_up_total"] = _float(up)
        row["bytes_total"] = _float(down) + _float(up)
        # what a clustered method's clustering came to when it is none ("" when it clustered, or
        # is not clustered); runs written before degenerate_kind existed are diagnosed here
        degenerate, kind = r.summary.get("degenerate"), r.summary.get("degenerate_kind")
        if "degenerate_kind" not in r.summary and (found := _diagnosed(spec, r)) is not None:
            degenerate, kind = found.line, found.kind
        row["degenerate"], row["degenerate_kind"] = str(degenerate or ""), str(kind or "")
        row["summary_sha256"] = r.summary_sha256  # lets the report notice runs newer than the aggregate
        provenance = r.summary.get("provenance") or {}  # runs written before it existed: unknown ("")
        row.update({column: str(provenance.get(key) or "") for column, key in PROVENANCE_COLUMNS.items()})
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame["seed"] = frame["seed"].astype("int64")
    frame["rounds"] = frame["rounds"].astype("int64")
    frame["clients"] = frame["clients"].astype("int64")
    return frame


def timing_frame(runs: list[RunOutputs]) -> pd.DataFrame:
    rows = [{"scenario": r.scenario, "method": r.method, "seed": r.seed,
             **{f: _float(r.timing.get(f)) for f in TIMING_FIGURES},
             "device": str(r.timing.get("device", "")),
             "finished_utc": str(r.timing.get("finished_utc") or ""),
             "git_commit": str(r.timing.get("git_commit") or ""),
             "spec_sha256": str(r.timing.get("spec_sha256") or ""),
             # "" unknown (no git, or a run written before it was recorded), else "true"/"false"
             "git_dirty": "" if r.timing.get("git_dirty") is None else str(bool(r.timing["git_dirty"])).lower()}
            for r in runs]
    frame = pd.DataFrame(rows)
    frame["seed"] = frame["seed"].astype("int64")
    return frame


def _mean_std(values: np.ndarray) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return float("nan"), float("nan")
    std = float(np.std(values, ddof=STD_DDOF)) if len(values) > STD_DDOF else float("nan")
    return float(np.mean(values)), std


def per_seed_frame(runs_df: pd.DataFrame, timing_df: pd.DataFrame) -> pd.DataFrame:
    """runs.parquet with each run's seconds_per_round: every figure the summary averages, per seed
    (the paper tables test differences between methods on these)."""
    return runs_df.merge(timing_df[["scenario", "method", "seed", "seconds_per_round"]],
                         on=["scenario", "method", "seed"], how="left", validate="one_to_one")


def summary_frame(spec: Spec, runs_df: pd.DataFrame, timing_df: pd.DataFrame) -> pd.DataFrame:
    merged = per_seed_frame(runs_df, timing_df)
    rows = []
    for (scenario, method), group in _groups(spec, merged):
        row: dict[str, Any] = {"scenario": scenario, "method": method,
                               "method_type": spec.method_type(method),
                               "hyperparams": group["hyperparams"].iloc[0], "seeds": len(group)}
        for f in SUMMARY_FIGURES:  # mixture_error exists only for mixture scenarios' runs
            values = group[f].to_numpy(dtype=float) if f in group else np.full(len(group), np.nan)
            row[f"{f}_mean"], row[f"{f}_std"] = _mean_std(values)
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame["seeds"] = frame["seeds"].astype("int64")
    return frame


def _groups(spec: Spec, frame: pd.DataFrame):
    """(scenario, method) groups in the spec's order (scenarios, then methods)."""
    for scenario in spec.scenarios:
        for method in spec.methods:
            group = frame[(frame["scenario"] == scenario) & (frame["method"] == method)]
            if len(group):
                yield (scenario, method), group.sort_values("seed", kind="stable")


def _numeric_rounds(rounds: pd.DataFrame) -> dict[str, np.ndarray]:
    columns = {}
    for column in rounds.columns:
        if column in _NOT_CURVES:
            continue
        series = rounds[column]
        if pd.api.types.is_bool_dtype(series) or not (pd.api.types.is_numeric_dtype(series)):
            continue  # a method's list or text column
        columns[column] = series.to_numpy(dtype="float64", na_value=np.nan)
    if "bytes_down" in columns and "bytes_up" in columns:
        # Summed per run before averaging: the mean over seeds of what each run had sent by then
        # (the x-axis of accuracy vs communication), with its own std over seeds.
        order = np.argsort(rounds["round"].to_numpy(dtype="int64"), kind="stable")
        sent = (columns["bytes_down"] + columns["bytes_up"])[order]
        cumulative = np.empty_like(sent)
        cumulative[order] = np.cumsum(sent)
        columns["bytes_cumulative"] = cumulative
    return columns


def curves_frame(spec: Spec, runs: list[RunOutputs]) -> pd.DataFrame:
    by_key: dict[tuple[str, str], list[RunOutputs]] = {}
    for r in runs:
        by_key.setdefault((r.scenario, r.method), []).append(r)
    per_run = {id(r): (r.rounds["round"].to_numpy(dtype="int64"), _numeric_rounds(r.rounds)) for r in runs}
    # Column order: the engine's (first run that has the column), stable across runs.
    names: list[str] = []
    for r in runs:
        for name in per_run[id(r)][1]:
            if name not in names:
                names.append(name)
    frames = []
    for scenario in spec.scenarios:
        for method in spec.methods:
            group = sorted(by_key.get((scenario, method), []), key=lambda r: r.seed)
            if not group:
                continue
            rounds = sorted({int(x) for r in group for x in per_run[id(r)][0]})
            index = {x: i for i, x in enumerate(rounds)}
            stack = {name: np.full((len(group), len(rounds)), np.nan) for name in names}
            present = np.zeros((len(group), len(rounds)), dtype=bool)
            for j, r in enumerate(group):
                numbers, columns = per_run[id(r)]
                positions = np.array([index[int(x)] for x in numbers], dtype=np.int64)
                present[j, positions] = True
                for name, values in columns.items():
                    stack[name][j, positions] = values
            data: dict[str, Any] = {"scenario": [scenario] * len(rounds), "method": [method] * len(rounds),
                                    "round": np.asarray(rounds, dtype="int64"),
                                    "seeds": present.sum(axis=0).astype("int64")}
            evaluated = np.isfinite(stack["acc_macro"]).any(axis=0) if "acc_macro" in stack else \
                np.zeros(len(rounds), dtype=bool)
            data["eval"] = evaluated
            for name in names:
                means, stds = zip(*(_mean_std(stack[name][:, i]) for i in range(len(rounds)))) \
                    if rounds else ((), ())
                data[f"{name}_mean"] = np.asarray(means, dtype="float64")
                data[f"{name}_std"] = np.asarray(stds, dtype="float64")
            frames.append(pd.DataFrame(data))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def final_clients_frame(runs: list[RunOutputs]) -> pd.DataFrame:
    frames = [r.final_clients.assign(scenario=r.scenario, method=r.method, seed=r.seed) for r in runs]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        {c: [] for c in ("scenario", "method", "seed", *FINAL_CLIENT_COLUMNS)})
    frame = frame.loc[:, ["scenario", "method", "seed", *FINAL_CLIENT_COLUMNS]]
    types = {"seed": "int64", "client": "int64", "group": "int64", "model": "int64", "acc": "float64",
             "loss": "float64", "n": "int64"}
    return frame.astype(types)


def build_tables(spec: Spec, runs: list[RunOutputs]) -> dict[str, pd.DataFrame]:
    runs_df = runs_frame(spec, runs)
    timing_df = timing_frame(runs)
    return {"runs": runs_df, "timing": timing_df, "summary": summary_frame(spec, runs_df, timing_df),
            "curves": curves_frame(spec, runs), "final_clients": final_clients_frame(runs)}


def read_aggregate(spec: Spec) -> dict[str, pd.DataFrame]:
    """The aggregate tables of `spec` (for the report). Raises CflpipeError when they are missing
    or were aggregated from a different run matrix."""
    out = aggregate_dir(spec)
    for name in AGGREGATE_FILES:
        if not (out / name).is_file():
            raise CflpipeError(f"{out / name}: missing; run `cflpipe aggregate --config FILE` (or snakemake) first")
    tables = {name: store.read_parquet(out / f"{name}.parquet")
              for name in ("runs", "curves", "summary", "timing", "final_clients")}
    runs = tables["runs"]
    have = sorted(zip(runs["scenario"], runs["method"], runs["seed"].astype(int)))
    want = sorted(spec.matrix())
    if have != want:
        raise CflpipeError(f"{out / 'runs.parquet'}: aggregated from a different set of runs than the spec asks "
                           f"for ({len(have)} vs {len(want)} runs); run `cflpipe aggregate --config FILE` again")
    hashes = runs["summary_sha256"] if "summary_sha256" in runs.columns else [""] * len(runs)
    for scenario, method, seed, digest in zip(runs["scenario"], runs["method"], runs["seed"], hashes):
        path = spec.run_dir(scenario, method, int(seed)) / "summary.json"
        if not path.is_file() or _sha256(path.read_bytes()) != digest:
            raise CflpipeError(f"{out}: out of date, {path} changed since it was aggregated; run "
                               f"`cflpipe aggregate --config FILE` again")
    return tables
