"""The robustness map: which clustered method recovers which kind of group, under which data,
participation and local budget. One column per scenario with ground-truth groups (a cell of the
map), one row per clustered method (Oracle, IFCA and FedAvg on top as references where the spec
runs them); ARI of the final clustering and personalized accuracy, mean over seeds. The cells'
coordinates are read from the scenarios themselves (group transforms, label split, clients per
round, local budget, and whether its clients change: new clients, drift), so any spec with two or more grouped scenarios has a map; the map spec
(config/experiments/robustness.yaml) is the grid of them. Drawn per method family; written as
tables/robustness.{md,csv}. A method entry's own `training` overrides are not coordinates: its
row sits under the scenario's participation and budget (the map spec gives methods none)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cflpipe import store
from cflpipe.report.tables import ONE_CLUSTER_MARK, fixed, is_clustered, is_reference, one_cluster_seeds
from cflpipe.report.view import AggregateView
from cflpipe.spec import LABEL_SPLITS, step_text

# Methods drawn above every family's rows when the spec runs them: told the groups, the method
# that recovered every group in the issue that asked for the map, and one model for all.
REFERENCE_TYPES = ("oracle", "ifca", "fedavg")
AXES = ("groups", "skew", "participation", "budget", "change")


def cell_coordinates(view: AggregateView, scenario: str) -> dict[str, str]:
    """A scenario's place on the map: its group transforms, the label split inside them, the
    share of clients a round trains, the local budget, and whether its clients change (new
    clients held out, groups that change)."""
    sc = view.spec.scenarios[scenario]
    t = view.scenario_training(scenario)
    groups = " × ".join(step_text(s).replace("_", " ") for s in sc.group_steps()) or "none"
    if (mixture := sc.step("mixture")) is not None:
        groups += f", mixed (Dir {mixture.alpha:g})"
    split = next((s for s in sc.partition if s.kind in LABEL_SPLITS), None)
    skew = {"iid": "IID", "natural": "natural"}.get(getattr(split, "kind", "iid"))
    if skew is None:
        skew = f"Dir {split.alpha:g}" if split.kind == "dirichlet" else f"{split.labels_per_client} labels"
    share = t.clients_per_round / sc.clients
    participation = "all" if share >= 1 else f"{t.clients_per_round} of {sc.clients}"
    budget = f"{t.local_steps} steps" if t.local_steps is not None else f"{t.local_epochs:g} epochs"
    change = "none"
    if sc.new_clients is not None:
        change = f"{sc.new_client_count()} new"
    elif sc.drift is not None:
        change = "; ".join(f"{sc.drift_count(e)} move in round {e.round}" for e in sc.drift)
    return {"groups": groups, "skew": skew, "participation": participation, "budget": budget, "change": change}


@dataclass
class RobustnessMap:
    scenarios: list[str]                  # the map's columns, in the spec's order
    coordinates: dict[str, dict[str, str]]
    varying: list[str]                    # the axes whose value differs between columns
    references: list[str]                 # rows above every family
    families: dict[str, list[str]]        # family title → its clustered methods
    ari: pd.DataFrame                     # methods × scenarios, mean over seeds
    acc: pd.DataFrame
    seeds: pd.DataFrame                   # runs behind each mean
    degenerate: pd.DataFrame              # seeds whose clustering came to none (summary.json)
    notes: list[str] = field(default_factory=list)

    # Scenarios whose coordinates are the same (cells that differ in what is no axis: the dataset,
    # the clients, the seed of the partition), named by their labels too.
    clashing: dict[str, str] = field(default_factory=dict)

    def column_label(self, scenario: str, joiner: str = " · ") -> str:
        text = joiner.join(self.coordinates[scenario][axis] for axis in self.varying) or scenario
        return f"{text}{joiner}{self.clashing[scenario]}" if scenario in self.clashing else text

    def rows(self) -> list[str]:
        return list(dict.fromkeys([*self.references, *(m for ms in self.families.values() for m in ms)]))


def robustness_map(view: AggregateView) -> RobustnessMap | None:
    """The map of the spec's runs; None when fewer than two scenarios have ground-truth groups
    or no clustered method ran on them."""
    from cflpipe.report.styles import FAMILY_TITLES

    scenarios = [s for s in view.spec.scenarios if view.has_groups(s) and view.methods_on(s)]
    ran = [m for m in view.methods if any(m in view.methods_on(s) for s in scenarios)]
    clustered = [m for m in ran if is_clustered(view.method_types[m]) and not is_reference(view.method_types[m])]
    if len(scenarios) < 2 or not clustered:
        return None
    coordinates = {s: cell_coordinates(view, s) for s in scenarios}
    varying = [a for a in AXES if len({coordinates[s][a] for s in scenarios}) > 1]
    references = [m for t in REFERENCE_TYPES for m in ran if view.method_types[m] == t]
    families: dict[str, list[str]] = {}
    for m in view.plot_order(clustered):
        if m not in references:
            families.setdefault(FAMILY_TITLES[view.styles[m].family], []).append(m)
    rows = list(dict.fromkeys([*references, *clustered]))
    frames = {name: pd.DataFrame(np.nan, index=rows, columns=scenarios) for name in ("ari", "acc", "seeds", "degenerate")}
    per_seed = view.per_seed
    for s in scenarios:
        for m in rows:
            mine = per_seed[(per_seed["scenario"] == s) & (per_seed["method"] == m)]
            if not len(mine):
                continue
            frames["ari"].loc[m, s] = _mean(mine["ari"]) if "ari" in mine else math.nan
            frames["acc"].loc[m, s] = _mean(mine["acc_macro"])
            frames["seeds"].loc[m, s] = len(mine)
            frames["degenerate"].loc[m, s] = one_cluster_seeds(per_seed, s, m)
    notes = [f"{ONE_CLUSTER_MARK}: in some seed the clustering came to none (one cluster throughout or by the end, "
             f"about one cluster per client, or a gate that never opened); the Clustering section says which."]
    rmap = RobustnessMap(scenarios, coordinates, varying, references, families, frames["ari"], frames["acc"],
                         frames["seeds"], frames["degenerate"], notes)
    labels = [rmap.column_label(s) for s in scenarios]
    rmap.clashing = {s: view.scenario_labels[s] for s, label in zip(scenarios, labels) if labels.count(label) > 1}
    return rmap


def _mean(values: pd.Series) -> float:
    finite = values.to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    return float(finite.mean()) if len(finite) else math.nan


def cell_text(value: float, marked: float, digits: int = 2, scale: float = 1.0) -> str:
    if not math.isfinite(value):
        return "–"
    text = fixed(value * scale, digits)
    return text + (f" {ONE_CLUSTER_MARK}" if marked and marked > 0 else "")


def to_markdown(rmap: RobustnessMap, labels: dict[str, str]) -> str:
    """ARI (and accuracy %, after a slash) per method × cell, the cells' coordinates as column
    heads: the map as a paper table."""
    heads = [rmap.column_label(s, "<br>") for s in rmap.scenarios]
    lines = [f"**Robustness map: ARI / personalized accuracy (%), mean over seeds** "
             f"(columns: {', '.join(rmap.varying) or 'scenario'})", "",
             "| method | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for m in rmap.rows():
        cells = []
        for s in rmap.scenarios:
            ari, acc, marked = rmap.ari.loc[m, s], rmap.acc.loc[m, s], rmap.degenerate.loc[m, s]
            cells.append("–" if not math.isfinite(acc) else
                         f"{cell_text(ari, marked)} / {acc * 100:.0f}")
        lines.append(f"| {labels.get(m, m)} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", *rmap.notes, ""])


def to_csv(rmap: RobustnessMap, labels: dict[str, str]) -> str:
    rows = []
    for m in rmap.rows():
        for s in rmap.scenarios:
            if not math.isfinite(rmap.acc.loc[m, s]):
                continue
            rows.append({"method": m, "label": labels.get(m, m), "scenario": s, **rmap.coordinates[s],
                         "ari": rmap.ari.loc[m, s], "acc_macro": rmap.acc.loc[m, s],
                         "seeds": int(rmap.seeds.loc[m, s]), "no_clustering_seeds": int(rmap.degenerate.loc[m, s])})
    return pd.DataFrame(rows).to_csv(index=False, float_format="%.6g")


def write_map_tables(rmap: RobustnessMap | None, labels: dict[str, str], out_dir: str | Path) -> list[Path]:
    """tables/robustness.{md,csv} (atomically); none, and old ones removed, without a map."""
    out = Path(out_dir)
    paths = [out / "robustness.md", out / "robustness.csv"]
    if rmap is None:
        for path in paths:
            path.unlink(missing_ok=True)
        return []
    store.write_text(paths[0], to_markdown(rmap, labels))
    store.write_text(paths[1], to_csv(rmap, labels))
    return paths
