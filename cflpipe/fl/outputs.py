"""A finished run's output files (metrics, clusters, rounds, timing, the axes' and the method's
own tables, plots.csv, config.yaml, timing.json and, last, summary.json), from the engine's Run
(`run`, named in words: fl/engine.py imports this module)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pandas as pd

from cflpipe import store
from cflpipe.fl.diagnosis import Degeneration, diagnose_clustering
from cflpipe.fl.runs import run_provenance, volatile_provenance
from cflpipe.fl.trainer_choice import AutoTrainer

# DVC cannot read Parquet: these evaluation figures are also written to plots.csv for `dvc plots`.
PLOT_COLUMNS = ("round", "acc_macro", "acc_micro", "global_acc_mean", "loss", "train_loss", "ari", "nmi",
                "n_clusters", "intra_acc", "inter_acc", "val_acc_macro")

STANDARD_TABLES = ("metrics", "clusters", "rounds", "timing")
METRICS_SCHEMA = {"round": "int32", "client": "int32", "split": "str", "model": "int32", "group": "int32",
                  "acc": "float64", "loss": "float64", "f1": "float64", "n": "int64"}
CLUSTERS_SCHEMA = {"round": "int32", "client": "int32", "cluster": "int32", "true_group": "int32"}
# Integer figures of rounds.parquet; nullable because evaluation figures exist only on
# evaluation rounds. Every other column is float64 (or a method's own list column).
ROUNDS_INTEGERS = ("round", "sampled", "skipped", "bytes_down", "bytes_up", "n_clusters", "singleton_clients",
                   "models", "global_models", "global_rows", "evaluated_clients", "train_evaluated_clients")


def best_round(full: pd.DataFrame) -> dict[str, Any]:
    """The best of the full evaluations (a sampled one's figure is an estimate from fewer
    clients), chosen on validation data where the scenario has a validation split: its round,
    its test acc_macro (`best_acc_macro`) and its val_acc_macro; without one the best test
    acc_macro, a choice made on test data, is named for what it is (`best_test_acc_macro`).
    The first of equal rounds wins."""
    on_validation = "val_acc_macro" in full.columns
    column = "val_acc_macro" if on_validation else "acc_macro"
    scores = full[column].to_numpy(dtype=float) if len(full) else np.empty(0)
    if not len(scores) or np.isnan(scores).all():
        row = None
    else:
        row = full.iloc[int(np.nanargmax(scores))]
    if not on_validation:
        return {"best_test_acc_macro": None if row is None else _plain(row["acc_macro"]),
                "best_round": None if row is None else int(row["round"]), "best_selected_on": "test"}
    # a run that reads no test split (training.eval_test false) has no test figure to name
    tested = "acc_macro" in full.columns
    return {**({"best_acc_macro": None if row is None else _plain(row["acc_macro"])} if tested else {}),
            "best_val_acc_macro": None if row is None else _plain(row["val_acc_macro"]),
            "best_round": None if row is None else int(row["round"]), "best_selected_on": "validation"}


def degeneration(run, rounds: pd.DataFrame) -> Degeneration | None:
    """What a clustered method's clustering came to when it is none (fl/diagnosis.py): one
    cluster throughout or at the end, one per client, or its gate kept it from clustering;
    None when it clustered, asked for one cluster (K = 1), or is no clustered method (Oracle
    is told the groups)."""
    capabilities = run.method.capabilities
    if not capabilities.clustered or capabilities.needs_groups:
        return None
    if capabilities.k_param and getattr(run.method.hp, capabilities.k_param, None) == 1:
        return None
    found = diagnose_clustering(rounds, run.data.num_clients, run.method.gate_note(rounds),
                                run.data.num_groups, capabilities.soft, run.method.collapse_note(rounds))
    if found is not None and (hint := run.method.clustering_hint(rounds, found.kind)):
        found = Degeneration(found.kind, f"{found.line}; {hint}")
    return found


def write_outputs(run) -> dict[str, Any]:
    d = run.run_dir
    metrics = _frame(run.tables["metrics"], METRICS_SCHEMA)
    clusters = _frame(run.tables["clusters"], CLUSTERS_SCHEMA)
    rounds = pd.DataFrame(dict(run.tables["rounds"]))
    for column in rounds.columns:
        if column in ROUNDS_INTEGERS:
            rounds[column] = rounds[column].astype("Int64")
        elif rounds[column].map(lambda v: v is None or isinstance(v, (int, float))).all():
            rounds[column] = rounds[column].astype("float64")
    timing = pd.DataFrame(dict(run.tables["timing"]))
    evals = rounds.dropna(subset=["acc_macro" if run.training.eval_test else "val_acc_macro"])
    final = {k: _plain(evals[k].iloc[-1]) for k in evals.columns} if len(evals) else {}
    summary = {
        "scenario": run.scenario, "method": run.method_name, "method_type": run.config["method_type"],
        "seed": run.seed, "rounds": run.training.rounds, "clients": run.data.num_clients,
        "final": final,
        **best_round(run.full_evaluations(evals)),
        "bytes_down_total": int(rounds["bytes_down"].sum()),
        "bytes_up_total": int(rounds["bytes_up"].sum()),
        "degenerate": None, "degenerate_kind": None,
    }
    for axis in run.axes:
        summary.update(axis.summary(run))
    if (found := degeneration(run, rounds)) is not None:
        summary.update(found.as_summary())
        print(f"warning: {run.scenario}/{run.method_name}/seed{run.seed}: {run.method_name} "
              f"{summary['degenerate']}", file=sys.stderr)
    summary["provenance"] = run_provenance(run.config, run.training)
    # Per-round means leave out the rounds that were a process's first (a resumed run can hold
    # two), unless nothing else is left; those rounds' seconds are reported apart.
    warmup = timing["warmup"].astype(bool) if "warmup" in timing else pd.Series(False, index=timing.index)
    steady = timing[~warmup] if len(timing) > int(warmup.sum()) else timing
    timing_summary = {"seconds_total": float(timing["seconds"].sum()),
                      "seconds_per_round": float(steady["seconds"].mean()),
                      "server_seconds_per_round": float(steady["server_seconds"].mean()),
                      "warmup_round_seconds": float(timing.loc[warmup, "seconds"].sum()),
                      "device": str(run.device), "trainer": run.trainer.name,
                      # plans each path trained in this process (a resumed run counts its part)
                      "plans_trained": dict(run.trainer.counts),
                      # auto on a CPU: which trainer each shape of plans went to, and why
                      **({"auto_choices": run.trainer.choices} if isinstance(run.trainer, AutoTrainer) else {}),
                      **volatile_provenance(run.run_dir),
                      "spec_sha256": run.resolved.spec_sha256}
    store.write_parquet(d / "metrics.parquet", metrics)
    store.write_parquet(d / "clusters.parquet", clusters)
    store.write_parquet(d / "rounds.parquet", rounds)
    store.write_parquet(d / "timing.parquet", timing)
    for name in run.tables.keys() - set(STANDARD_TABLES):  # a method's own eval tables
        store.write_parquet(d / f"{name}.parquet", pd.DataFrame(dict(run.tables[name])))
    store.write_json(d / "timing.json", timing_summary)
    store.write_text(d / "plots.csv", evals[[c for c in PLOT_COLUMNS if c in evals.columns]]
                     .to_csv(index=False, float_format="%.6g", na_rep=""))
    store.write_text(d / "config.yaml", run.config_text)
    store.write_json(d / "summary.json", summary)  # last: its presence marks a finished run
    return summary


def _frame(columns: dict[str, list], schema: dict[str, str]) -> pd.DataFrame:
    frame = pd.DataFrame({k: columns.get(k, []) for k in schema})
    return frame.astype(schema)


def _plain(value: Any) -> Any:
    if value is pd.NA:
        return None
    if isinstance(value, (np.floating, float)):
        return None if np.isnan(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value
