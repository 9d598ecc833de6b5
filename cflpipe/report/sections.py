"""The report page's sections, results first as the page shows them: each is the dict (or list of
dicts, one per scenario) that templates/index.html.j2 renders, with its figures from
report/figures.py and its numbers from the aggregate view (report/view.py)."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from cflpipe import __version__
from cflpipe.fl.axes import scenario_axes
from cflpipe.partition import small_test_sets, small_validation_sets
from cflpipe.report.figures import FigureBuilder
from cflpipe.report.ranks import q_alpha, rank_methods
from cflpipe.report.styles import FAMILY_TITLES
from cflpipe.report.tables import (DASH, DRIFT_TABLES, NEW_CLIENT_TABLES, PaperTable, TableSpec, fixed, format_mean_std, is_reference, mark_best,
                                   paper_tables, seed_values, table_specs, verdict)
from cflpipe.report.view import RANK_FIGURE, RANK_FIGURE_TITLE, AggregateView, find_sweeps
from cflpipe.spec import TRAINING_KEYS, Training, spec_sha256

# Columns of the per-scenario detail tables: (figure, header, scale, digits, direction) where
# direction +1 marks the highest mean best, -1 the lowest, 0 marks nothing.
# Above this many methods on a scenario, its accuracy curves are drawn one figure per method
# family (20 curves in one figure were an unreadable tangle).
FACET_METHODS = 10

DETAIL_COLUMNS = (
    ("acc_macro", "acc macro %", 100, 1, 1), ("acc_micro", "acc micro %", 100, 1, 1),
    ("acc_worst10", "worst-10% acc %", 100, 1, 1), ("global_acc_mean", "global acc %", 100, 1, 1),
    ("f1_macro", "F1 macro", 1, 3, 1), ("f1_micro", "F1 micro", 1, 3, 1), ("ari", "ARI", 1, 3, 1),
    ("nmi", "NMI", 1, 3, 1), ("n_clusters", "clusters", 1, 1, 0), ("intra_acc", "intra %", 100, 1, 1),
    ("inter_acc", "inter %", 100, 1, 0), ("bytes_total", "MB total", 1e-6, 2, -1),
    ("seconds_per_round", "s / round", 1, 3, -1),
)


# Below this mean ARI no method is named best at clustering in "At a glance": an ARI of 0.5 is
# about the agreement of a clustering that gets half of the groups' pairs right beyond chance,
# and a "best ARI 0.02" in bold reads as a result where there is none.
RECOVERED_ARI = 0.5

class Sections:
    """The sections of one report. Figures are numbered in the order they are built: render_report
    (report/page.py) calls the sections in one fixed order, so one aggregate gives one page."""

    def __init__(self, view: AggregateView):
        self.view = view
        self.figures = FigureBuilder(view)

    def glance(self) -> dict[str, Any]:
        """Who won, on screen one: per scenario the best personalized accuracy and, where there
        are true groups, the best ARI among the methods that are not told the groups, each with
        the runner-up and the paired test's verdict in words; and the best average rank."""
        view = self.view
        rows = []
        for s in view.spec.scenarios:
            methods = [m for m in view.methods_on(s) if not is_reference(view.method_types[m])]
            clustered = [m for m in methods if m in view.clustering_methods()]
            sc = view.spec.scenarios[s]
            rows.append({"scenario": view.scenario_labels[s], "anchor": s,
                         "accuracy": self._leader(s, methods, "acc_macro", 100.0, 1, " %"),
                         "ari": self._leader(s, clustered, "ari", 1.0, 2, "") if view.has_groups(s) else None,
                         "new": self._axis_leader(s, methods, "new_acc_macro", (("new_joined", "placed with their group",
                                                                                  "{:.2f}"),))
                         if sc.new_clients is not None else None,
                         "movers": self._axis_leader(s, methods, "moved_acc_macro", (
                             ("drift_joined", "placed with their new group", "{:.2f}"),
                             ("rounds_to_place", "rounds to place (of those placed)", "{:.1f}")))
                         if sc.drift is not None else None})
        scores, excluded = view.rank_scores()
        ranking = rank_methods(scores, excluded, RANK_FIGURE) if scores.shape[1] else None
        rank = None
        if ranking is not None and len(ranking.average):
            order = ranking.average.sort_values(kind="stable")
            tied = [m for m in order.index if order[m] == order.iloc[0]]  # equal averages: a tie, said so
            rest = order.drop(tied)
            rank = {"method": _together([view.label(m) for m in tied]),
                    "average": f"{order.iloc[0]:.2f}" + (", tied" if len(tied) > 1 else ""),
                    "next": view.label(rest.index[0]) if len(rest) else None,
                    "next_average": f"{rest.iloc[0]:.2f}" if len(rest) else None,
                    "scenarios": len(ranking.scenarios),
                    "test": (f"Friedman p = {ranking.p_value:.2g}" if ranking.tested else "not tested")}
        return {"rows": rows, "rank": rank, "grouped": any(r["ari"] is not None for r in rows)}

    def _axis_leader(self, scenario: str, methods: list[str], figure: str,
                     also: tuple[tuple[str, str, str], ...]) -> dict[str, str] | None:
        """An evaluation axis's line (new clients, movers): the leader by the seeds' mean of
        `figure` (an accuracy) against the runner-up, as _leader, and `also`, the leader's (and
        runner-up's) mean of each (figure, words, format), the first being the share placed with
        the group: nothing for a method that places none in clusters (no share: FedAvg), "never"
        where a later figure is undefined (rounds to place where no client was placed)."""
        leader = self._leader(scenario, methods, figure, 100.0, 1, " %")
        if leader is None:
            return None

        def extras(names: list[str]) -> str:
            texts: dict[str, str | None] = {}  # method → its text (None: it places none in clusters)
            for m in names:
                values = [_mean_of(seed_values(self.view.per_seed, scenario, m, column)) for column, _, _ in also]
                texts[m] = None if values[0] is None else "; ".join(
                    f"{words} " + ("never" if v is None else fmt.format(v)) for (_, words, fmt), v in zip(also, values))
            if len(set(texts.values())) == 1:  # one text for all (tied methods say it once), or none has one
                return next(iter(texts.values())) or ""
            return " / ".join(f"{self.view.label(m)}: {text or 'no clusters'}" for m, text in texts.items())

        return {**leader, "best_also": extras(leader["methods"]), "next_also": extras(leader["next_methods"])}

    def _leader(self, scenario: str, methods: list[str], figure: str, scale: float, digits: int,
                unit: str) -> dict[str, str] | None:
        view = self.view
        values = {m: seed_values(view.per_seed, scenario, m, figure) for m in methods}
        means = {m: sum(v.values()) / len(v) for m, v in values.items() if v}
        if not means:
            return None
        order = sorted(means, key=lambda m: -means[m])  # stable: the spec's order on equal means
        best = order[0]
        if figure == "ari" and means[best] < RECOVERED_ARI:  # nobody recovered the groups: no winner
            return {"best": "none recovered the groups",
                    "value": f"(highest: {view.label(best)} {fixed(means[best] * scale, digits)}{unit})",
                    "next": None, "next_value": None, "verdict": f"every mean ARI below {RECOVERED_ARI:g}",
                    "methods": [], "next_methods": []}
        tied = [m for m in order if means[m] == means[best]]  # equal means (ARI 1.00 in every seed): a tie
        rest = [m for m in order if m not in tied]
        out = {"best": _together([view.label(m) for m in tied]), "value": f"{fixed(means[best] * scale, digits)}{unit}",
               "next": None, "next_value": None, "methods": tied, "next_methods": rest[:1],
               "verdict": f"tied: equal means over {_seeds(len(values[best]))}" if len(tied) > 1
               else f"n = {len(values[best])}"}
        if rest:
            second = rest[0]
            out.update(next=view.label(second), next_value=f"{fixed(means[second] * scale, digits)}{unit}")
            if len(tied) == 1:
                out["verdict"] = verdict(values[best], values[second])
        return out

    def setup(self) -> dict[str, Any]:
        from cflpipe.registry import scenario_hyperparams

        view = self.view
        names = [view.scenario_labels[s] for s in view.spec.scenarios]
        settings: dict[str, list[str]] = {}
        axes = {"new": any(sc.new_clients is not None for sc in view.spec.scenarios.values()),
                "drift": any(sc.drift is not None for sc in view.spec.scenarios.values())}
        for s, sc in view.spec.scenarios.items():
            t = view.scenario_training(s)
            for what, value in (
                    ("dataset", sc.dataset.name + (f" ({', '.join(f'{k}={v}' for k, v in sc.dataset.params.items())})"
                                                   if sc.dataset.params else "")),
                    ("clients", sc.clients), ("partition", ", ".join(_step_text(step) for step in sc.partition)),
                    ("partition seed", sc.seed), ("model", t.model), ("rounds", t.rounds),
                    ("local work per round", _local_text(t)), ("batch size", t.batch_size),
                    ("lr", f"{t.lr:g}" + (f" (× {t.lr_decay:g} per round)" if t.lr_decay != 1 else "")),
                    ("momentum", f"{t.momentum:g}"), ("weight decay", f"{t.weight_decay:g}"),
                    ("clients per round", t.clients_per_round),
                    ("evaluated every", _evaluation_text(t, sc.participants, _final_counts(view.runs, s),
                                                         _final_counts(view.runs, s, "evaluated_clients"))
                     + _pooled_text(_final_counts(view.runs, s, "global_rows"))),
                    ("device", t.device), ("trainer", t.trainer),
                    ("seeds", ", ".join(str(k) for k in view.spec.seeds)),
                    ("scenario hyperparams", _kv_text(sc.hyperparams)),
                    *((("new clients", held_out_text(sc)),) if axes["new"] else ()),
                    *((("groups that change", moves_text(sc)),) if axes["drift"] else ()),
                    *((axis.title, "none" if getattr(sc, key) is None else axis.describe(getattr(sc, key), sc.participants))
                      for key, axis in keyed_axes(view.spec).items())):
                settings.setdefault(what, []).append(str(value) + self._tuned_here(s, what))
        methods = []
        for m in view.methods:
            ran = [s for s in view.spec.scenarios if m in view.methods_on(s)]
            if not ran:
                continue
            overrides, shared, given = {}, {}, {}
            own = view.spec.methods[m].hyperparams
            for s in ran:
                given[s] = _kv_text({**own, **view.spec.chosen(s, m).hyperparams})
                base, resolved = view.scenario_training(s).model_dump(), view.spec.resolved_training(s, m).model_dump()
                overrides[s] = _kv_text({k: resolved[k] for k in TRAINING_KEYS if resolved[k] != base[k]})
                tuned = view.spec.chosen(s, m).hyperparams
                shared[s] = _kv_text({k: v for k, v in scenario_hyperparams(view.spec, s, m).items()
                                      if k not in own and k not in tuned})
            methods.append({"method": view.label(m), "type": view.method_types[m],
                            "family": FAMILY_TITLES[view.styles[m].family],
                            "scenarios": ", ".join(view.scenario_labels[s] for s in ran)
                            if len(ran) < len(view.spec.scenarios) else "all",
                            "training": self._per_scenario(overrides), "hyperparams": self._per_scenario(given),
                            "from_scenario": self._per_scenario(shared)})
        return {"scenario_names": names, "settings": list(settings.items()), "methods": methods,
                "provenance": self.provenance(), "key": self.figures.style_key(),
                "protocol": protocol_sentence(view.spec)}

    def _tuned_here(self, scenario: str, row: str) -> str:
        """Where tuning chose a setting of this row for some of the scenario's methods: that the
        value shown is the spec's, theirs in the methods table."""
        spec = self.view.spec
        keys = TUNED_ROWS.get(row, ())
        if spec.tuning is None or not keys:
            return ""
        ran = self.view.methods_on(scenario)
        tuned = [m for m in spec.tuned_methods() if m in ran and set(spec.tuning.keys_of(m)) & set(keys)]
        if not tuned:
            return ""
        return f" (tuned for {len(tuned)} of {len(ran)} methods: their values in the methods table)"

    def _per_scenario(self, texts: dict[str, str]) -> str:
        """One text when every scenario has it, else `text (scenarios); …` grouped by text."""
        if len(set(texts.values())) == 1:
            return next(iter(texts.values()))
        groups: dict[str, list[str]] = {}
        for s, text in texts.items():
            groups.setdefault(text, []).append(self.view.scenario_labels[s])
        return "; ".join(f"{text} ({', '.join(where)})" for text, where in groups.items())

    def provenance(self) -> list[tuple[str, str]]:
        """(what, value) rows: how and when the runs were made, from summary.json's provenance
        (runs.parquet) and timing.json (timing.parquet); "unknown" where a run did not record it."""
        runs, timing = self.view.runs, self.view.timing

        def values(frame: pd.DataFrame, column: str, unknown: str = "unknown") -> str:
            found = [str(v) for v in frame[column]] if column in frame.columns else [""] * len(frame)
            known = sorted(set(found) - {""})
            missing = found.count("")
            text = ", ".join(known) if known else unknown
            if known and missing:
                text += f" ({missing} of {len(found)} runs: {unknown})"
            return text

        now = spec_sha256(self.view.spec)
        recorded = sorted(set(timing["spec_sha256"]) - {""}) if "spec_sha256" in timing.columns else []
        spec_text = now
        others = [h for h in recorded if h != now]
        if others:
            count = int(timing["spec_sha256"].isin(others).sum())
            spec_text += (f" ({count} of {len(timing)} runs were trained under another version of the spec: "
                          f"{', '.join(h[:12] for h in others)}; their config.yaml still matches this one)")
        finished = sorted(v for v in timing.get("finished_utc", pd.Series(dtype=str)).astype(str) if v)
        dates = "unknown" if not finished else _utc(finished[0]) if finished[0] == finished[-1] else \
            f"{_utc(finished[0])} to {_utc(finished[-1])}"
        if finished and len(finished) < len(timing):
            dates += f" ({len(timing) - len(finished)} of {len(timing)} runs: unknown)"
        commits = values(timing, "git_commit", "unknown (results not in a git checkout)")
        if "git_dirty" in timing.columns and (timing["git_dirty"].astype(str) == "true").any():
            commits += " (with uncommitted changes to tracked files)"
        return [("cflpipe", values(runs, "cflpipe_version") + f" (this report: {__version__})"),
                ("torch", values(runs, "torch_version")), ("python", values(runs, "python_version")),
                ("device requested", values(runs, "device_requested")),
                ("device used", values(timing, "device")),
                ("runs finished", dates), ("git commit", commits),
                ("spec hash", spec_text + " (sha256 of seeds, training, scenarios and methods; labels, "
                                          "description, report and paths left out)")]

    def accuracy(self) -> list[dict[str, Any]]:
        view = self.view
        out = []
        for s in view.spec.scenarios:
            label = view.scenario_labels[s]
            figs = [*self.family_curves(s, "acc_macro", f"{label}: personalized accuracy"),
                    self.figures.curve_figure(s, "global_acc_mean", f"{label}: global accuracy (mean ± std over seeds)",
                                              "accuracy %", 100),
                    self.figures.loss_figure(s)]
            out.append({"scenario": s, "label": label, "figures": [f for f in figs if f is not None]})
        return out

    def family_curves(self, scenario: str, figure: str, title: str) -> list:
        """One curve figure of all methods; with more than FACET_METHODS methods (a tangle), one
        per method family instead, each with the references and the first baseline to read the
        family against."""
        view = self.view
        methods = view.plot_order(view.methods_on(scenario))
        families = list(dict.fromkeys(view.styles[m].family for m in methods))
        if len(methods) <= FACET_METHODS or len(families) < 2:
            return [self.figures.curve_figure(scenario, figure, f"{title} (mean ± std over seeds)", "accuracy %", 100)]
        anchors = [m for m in methods if view.styles[m].family == "reference"]
        anchors += [m for m in methods if view.styles[m].family == "baseline"][:1]
        return [self.figures.curve_figure(
                    scenario, figure, f"{title}: {FAMILY_TITLES[family]} (mean ± std over seeds)", "accuracy %", 100,
                    methods=list(dict.fromkeys([*anchors, *(m for m in methods if view.styles[m].family == family)])))
                for family in families if family not in ("reference", "baseline")] + \
            [self.figures.curve_figure(scenario, figure, f"{title}: reference and baselines (mean ± std over seeds)",
                                       "accuracy %", 100,
                                       methods=[m for m in methods if view.styles[m].family in ("reference", "baseline")])]

    def comparison(self) -> tuple[list[PaperTable], list[dict[str, Any]]]:
        view = self.view
        specs = table_specs(view.spec.report.tables)
        if any(sc.new_clients is not None for sc in view.spec.scenarios.values()):
            specs += NEW_CLIENT_TABLES
        if any(sc.drift is not None for sc in view.spec.scenarios.values()):
            specs += DRIFT_TABLES
        specs += tuple(TableSpec(*table) for axis in keyed_axes(view.spec).values() for table in axis.tables)
        tables = paper_tables(view.per_seed, list(view.spec.scenarios), view.methods, view.method_types,
                              ari_methods=view.clustering_methods(), tables=specs,
                              method_labels=view.method_labels, scenario_labels=view.scenario_labels,
                              protocol=protocol_caption(view.spec))
        details = []
        for s in view.spec.scenarios:
            methods = view.methods_on(s)
            columns = [c for c in DETAIL_COLUMNS if any(
                math.isfinite(float(view.summary_row(s, m)[f"{c[0]}_mean"])) for m in methods)]
            rows = []
            marks: dict[str, dict[str, tuple[str, float]]] = {}
            reference = {m for m in methods if is_reference(view.method_types[m])}
            for figure, _, scale, digits, direction in columns:
                pool = view.clustered_methods(s) if figure in ("ari", "nmi") else methods
                values = {m: seed_values(view.per_seed, s, m, figure, scale) for m in pool}
                marks[figure] = mark_best(values, direction, reference)
            for m in methods:
                r = view.summary_row(s, m)
                cells = []
                for f, _, sc, d, _ in columns:
                    mark = marks[f].get(m, ("", math.nan))[0]
                    cells.append({"text": format_mean_std(float(r[f"{f}_mean"]) * sc, float(r[f"{f}_std"]) * sc, d),
                                  "bold": mark == "best", "tied": mark == "tied"})
                rows.append({"method": view.label(m), "type": view.method_types[m], "seeds": int(r["seeds"]),
                             "hyperparams": _hp_text(r["hyperparams"]), "cells": cells})
            details.append({"scenario": s, "label": view.scenario_labels[s], "headers": [c[1] for c in columns],
                            "rows": rows})
        return tables, details

    def ranking(self) -> dict[str, Any]:
        scores, excluded = self.view.rank_scores()
        ranking = rank_methods(scores, excluded, RANK_FIGURE) if scores.shape[1] else None
        out: dict[str, Any] = {"figure_title": RANK_FIGURE_TITLE, "alpha": None, "rows": [], "scenarios": [],
                               "test": None, "notes": [], "figure": None,
                               "excluded": self._by_reason(excluded)}
        if ranking is None:
            out["notes"].append("Fewer than two methods ran on every scenario: there is nothing to rank.")
            return out
        out["excluded"] = self._by_reason(ranking.excluded)
        out["scenarios"] = [self.view.scenario_labels.get(s, s) for s in ranking.scenarios]
        out["alpha"] = f"{ranking.alpha:g}"
        for m in ranking.average.sort_values(kind="stable").index:
            out["rows"].append({"method": self.view.label(m), "average": f"{ranking.average[m]:.2f}",
                                "cells": [(f"{ranking.ranks.loc[s, m]:g}", f"{ranking.scores.loc[s, m] * 100:.1f}")
                                          for s in ranking.scenarios]})
        k, n = len(ranking.methods), len(ranking.scenarios)
        if ranking.tested:
            text = f"Friedman test over {n} scenarios and {k} methods: χ²({k - 1}) = {ranking.statistic:.3g}, " \
                   f"p = {ranking.p_value:.3g}"
            if ranking.cd is not None:
                text += (f"; Nemenyi critical difference CD = q·√(k(k+1)/(6N)) = {q_alpha(k, ranking.alpha):.3f}·"
                         f"√({k}·{k + 1}/(6·{n})) = {ranking.cd:.2f} at α = {ranking.alpha:g}")
            out["test"] = text + "."
        out["notes"] = list(ranking.notes)
        if ranking.cd is not None:
            out["figure"] = self.figures.cd_diagram(ranking)
        return out

    def _by_reason(self, excluded: dict[str, str]) -> list[tuple[str, str]]:
        """(reason, methods) with the methods that share a reason listed together."""
        groups: dict[str, list[str]] = {}
        for m, why in excluded.items():
            groups.setdefault(why, []).append(self.view.label(m))
        return [(why, ", ".join(names)) for why, names in groups.items()]

    def clients(self) -> list[dict[str, Any]]:
        return [{"scenario": s, "label": self.view.scenario_labels[s], "figure": self.figures.client_accuracy_figure(s)}
                for s in self.view.spec.scenarios]

    def clustering(self) -> list[dict[str, Any]]:
        view = self.view
        out = []
        for s in view.spec.scenarios:
            grouped = view.has_groups(s)
            clustered = view.clustered_methods(s)
            others = [m for m in view.methods_on(s) if m not in clustered]
            figs, notes = [], []
            if grouped and clustered:
                figs += [self.figures.curve_figure(s, "ari", f"{view.scenario_labels[s]}: ARI vs true groups", "ARI", methods=clustered,
                                                   yaxis=dict(range=[-0.05, 1.05])),
                         self.figures.curve_figure(s, "nmi", f"{view.scenario_labels[s]}: NMI vs true groups", "NMI", methods=clustered,
                                                   yaxis=dict(range=[-0.05, 1.05]))]
            elif grouped:
                notes.append("no method clusters clients here: ARI and NMI are 0 by construction")
            else:
                notes.append("no ground-truth groups: ARI and NMI are undefined for this scenario")
            most = max([view.max_clusters(s, m) for m in view.methods_on(s)] + [1.0])
            figs.append(self.figures.curve_figure(s, "n_clusters", f"{view.scenario_labels[s]}: number of clusters (mean over seeds)",
                                                  "clusters", yaxis=dict(rangemode="tozero", tick0=0,
                                                                         dtick=max(1, math.ceil(most / 8)))))
            figs += self.figures.method_figures(s)
            heatmaps = []
            for m in clustered:
                fig, note = self.figures.assignment_heatmap(s, m)
                if fig is not None:
                    heatmaps.append(fig)
                if note:
                    notes.append(note)
                similarity = self.figures.similarity_heatmap(s, m)
                if similarity is not None:
                    heatmaps.append(similarity)
            if others:
                notes.append(f"one cluster throughout (no assignment heatmap): {', '.join(view.label(m) for m in others)}")
            notes += view.never_clustered(s)
            out.append({"scenario": s, "label": view.scenario_labels[s], "figures": [f for f in figs if f is not None],
                        "heatmaps": heatmaps,
                        "notes": notes})
        return out

    def drift(self) -> list[dict[str, Any]] | None:
        """Per scenario whose groups change (scenario drift): ARI against the truth of each round,
        the moved clients' accuracy and the share placed with their new group, each move marked;
        None without such a scenario."""
        view = self.view
        out = []
        for s, sc in view.spec.scenarios.items():
            if sc.drift is None:
                continue
            marks = [event.round for event in sc.drift]
            figures = [self.figures.curve_figure(s, "ari", "ARI against the groups of each round (mean ± std over seeds)",
                                                 "ARI", methods=view.clustering_methods(), marks=marks),
                       self.figures.curve_figure(s, "moved_acc_macro", "The moved clients' personalized accuracy "
                                                 "(mean ± std over seeds)", "accuracy %", 100, marks=marks),
                       self.figures.curve_figure(s, "drift_joined", "Moved clients placed in the cluster of most of "
                                                 "their new group (share; mean over seeds)", "share",
                                                 methods=view.clustering_methods(), marks=marks)]
            out.append({"scenario": s, "label": view.scenario_labels[s], "figures": [f for f in figures if f],
                        "moves": moves_text(sc)})
        return out or None

    def communication(self) -> list[dict[str, Any]]:
        return [{"scenario": s, "label": self.view.scenario_labels[s], "figures": self.figures.communication_figures(s)}
                for s in self.view.spec.scenarios]

    def intra_inter(self) -> list[dict[str, Any]]:
        out = []
        for s in self.view.spec.scenarios:
            if not self.view.has_groups(s):
                out.append({"scenario": s, "label": self.view.scenario_labels[s], "figure": None,
                            "note": "no ground-truth groups: intra/inter-cluster accuracy is undefined"})
                continue
            fig = self.figures.intra_inter_figure(s)
            out.append({"scenario": s, "label": self.view.scenario_labels[s], "figure": fig,
                        "note": None if fig else "intra/inter-cluster accuracy was not recorded"})
        return out

    def robustness(self) -> dict[str, Any] | None:
        """The robustness map (report/robustness.py): a heat map per method family, the cells'
        coordinates, and the map itself for tables/robustness.*; None without one."""
        from cflpipe.report.figures import robustness_heatmaps
        from cflpipe.report.robustness import robustness_map

        rmap = robustness_map(self.view)
        if rmap is None:
            return None
        figures = robustness_heatmaps(self.figures.registry, rmap, self.view.method_labels)
        cells = [{"label": rmap.column_label(s), "scenario": self.view.scenario_labels[s],
                  "coordinates": rmap.coordinates[s]} for s in rmap.scenarios]
        return {"map": rmap, "figures": figures, "cells": cells, "axes": rmap.varying, "notes": rmap.notes}

    def tuning(self) -> dict[str, Any] | None:
        """The chosen values per tuned method × scenario, every trial's score, and a tuning curve
        per scenario; None without tuning."""
        view = self.view
        if view.spec.tuning is None:
            return None
        scenarios = [s for s in view.spec.scenarios if any(key[0] == s for key in view.tuning)]
        rows, trials = [], []
        for m in view.spec.tuned_methods():
            cells = []
            for s in scenarios:
                c = view.tuning.get((s, m))
                if c is None:
                    cells.append("")
                    continue
                best = next(t for t in c["trials"] if t["trial"] == c["chosen"])
                cells.append(f"{_kv_text(c['values'])} ({best['score'] * 100:.1f} %)")
                for t in c["trials"]:
                    trials.append({"method": view.label(m), "scenario": view.scenario_labels[s],
                                   "values": _kv_text(t["values"]), "chosen": t["trial"] == c["chosen"],
                                   "score": "failed" if t["score"] is None else
                                   f"{t['score'] * 100:.2f}" + ("" if t["std"] is None else f" ± {t['std'] * 100:.2f}")})
            if any(cells):
                rows.append({"method": view.label(m), "cells": cells})
        return {"scenarios": [view.scenario_labels[s] for s in scenarios], "rows": rows, "trials": trials,
                "figures": [f for s in scenarios if (f := self.figures.tuning_figure(s)) is not None]}

    def sweeps(self) -> list[dict[str, Any]]:
        found = find_sweeps(self.view.summary, self.view.spec)
        return [{"sweep": sw, "figure": self.figures.sweep_figure(sw)} for sw in found]

    def overview(self) -> list[dict[str, Any]]:
        view = self.view
        out = []
        for name, sc in view.spec.scenarios.items():
            stats = view.stats[name]
            item: dict[str, Any] = {
                "name": name, "dataset": sc.dataset.name,
                "dataset_params": ", ".join(f"{k}={v}" for k, v in sc.dataset.params.items()),
                "clients": sc.clients, "steps": [_step_text(s) for s in sc.partition],
                "groups": sc.groups_text(),
                "test_fraction": sc.test_fraction, "pool": sc.pool, "partition_seed": sc.seed,
                "methods": [view.label(m) for m in view.methods_on(name)], "label": view.scenario_labels[name],
                "seeds": sorted({int(k) for k in view.runs.loc[view.runs["scenario"] == name, "seed"]}),
                "rounds": sorted({int(r) for r in view.runs.loc[view.runs["scenario"] == name, "rounds"]}),
                "figure": self.figures.label_heatmap(name), "note": None,
                "new_clients": None if sc.new_clients is None else held_out_text(sc),
                "drift": None if sc.drift is None else moves_text(sc),
                "public": None if sc.public is None else
                f"{sc.public.size or 'all'} unlabeled samples of the {sc.public.source} split (never given to a client)",
            }
            if stats is not None:
                labels = [c for c in stats.columns if c.startswith("label_")]
                item.update(classes=len(labels), n_train=int(stats["n_train"].sum()),
                            n_test=int(stats["n_test"].sum()),
                            note="; ".join(n for n in (small_test_sets(stats), small_validation_sets(stats)) if n) or None,
                            n_val=int(stats["n_val"].sum()) if "n_val" in stats else None,
                            validation_fraction=sc.validation_fraction)
            else:
                item["note"] = (f"{view.spec.partition_dir(name) / 'stats.parquet'} is missing; run "
                                f"`cflpipe partition --config FILE --scenario {name}`")
            out.append(item)
        return out


def _step_text(step) -> str:
    fields = step.model_dump(exclude={"kind"}, exclude_none=True)
    if fields.get("ground_truth") is True:  # the default: said only when a step's groups are not the truth
        del fields["ground_truth"]
    if not fields:
        return step.kind
    return f"{step.kind}(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"


def _final_counts(runs: pd.DataFrame, scenario: str, column: str = "train_evaluated_clients") -> list[int]:
    """The scenario's runs' final values of an integer figure (none where no run recorded it)."""
    if column not in runs.columns:
        return []
    values = runs.loc[runs["scenario"] == scenario, column].dropna()
    return [int(v) for v in values]


def _span(values: list[int]) -> str:
    """"n" or "low–high" of some counts (sorted, distinct)."""
    return f"{values[0]:,}" if len(values) == 1 else f"{values[0]:,}–{values[-1]:,}"


def _pooled_text(pooled_rows: list[int]) -> str:
    """Where runs scored their models on a sample of the pooled test rows
    (evaluation.MAX_SCORED_ROWS): how many rows each read."""
    if not pooled_rows:
        return ""
    return (f"; global and intra/inter accuracy of the models scored on the pooled test data from a seeded "
            f"sample of {_span(sorted(set(pooled_rows)))} of its rows")


def _evaluation_text(t: Training, clients: int | None, train_read: list[int], evaluated: list[int] = ()) -> str:
    """How often and what evaluations read; `train_read`: how many clients' training splits the
    scenario's runs read in their final evaluation (eval_train auto decides by the data);
    `evaluated`: how many clients their final evaluation read (full_eval_clients)."""
    text = "round" if t.eval_every == 1 else f"{t.eval_every} rounds"
    read = sorted(set(train_read))
    if t.eval_train is False or (t.eval_train == "auto" and read == [0]):
        text += " (test splits only" + (": every client's already costs a training round)" if t.eval_train else ")")
    elif t.eval_train == "auto" and read and (clients is None or read[0] < clients):
        text += (f" (training splits of a seeded sample of {_span(read)}{'' if clients is None else f' of {clients}'} "
                 f"clients, so that an evaluation "
                 f"costs no more than a training round)")
    counts = sorted(set(evaluated))
    population = "every client"
    if counts and clients is not None and counts[0] < clients:
        population = (f"a seeded sample of {_span(counts)} of {clients:,} clients (the same for every method; "
                      f"training.full_eval_clients)")
    if t.eval_clients is None:
        return text if population == "every client" else f"{text}: {population}"
    full = f"every {t.full_eval_every} rounds and the last" if t.full_eval_every else "the last round"
    return f"{text}: a seeded sample of {t.eval_clients} clients, {population} in {full}"


def _local_text(t: Training) -> str:
    return f"{t.local_steps} steps" if t.local_steps is not None else f"{t.local_epochs:g} epochs"


# The setup table's rows a tuned training key changes (spec/_tuning.py TUNABLE_TRAINING).
TUNED_ROWS = {"lr": ("lr", "lr_decay"), "local work per round": ("local_steps", "local_epochs"),
              "batch size": ("batch_size",), "momentum": ("momentum",), "weight decay": ("weight_decay",)}


def _tuned_keys(spec) -> str:
    keys = list(dict.fromkeys(k for m in spec.tuned_methods() for k in spec.tuning.keys_of(m)))
    return ", ".join(keys)


def protocol_caption(spec) -> str:
    """How the hyper-parameters were set, for a table's caption."""
    if spec.tuning is not None:
        return (f"{_tuned_keys(spec)} tuned per method and scenario on validation data "
                f"(tuning seeds {', '.join(map(str, spec.tuning.seeds))})")
    return {"shared": "shared hyper-parameters, untuned", "paper": "the papers' hyper-parameters, untuned",
            None: "hyper-parameters as the spec sets them, untuned"}[spec.protocol]


def protocol_sentence(spec) -> str:
    """The setup section's one sentence on how the hyper-parameters were set."""
    if spec.tuning is not None:
        t = spec.tuning
        trials = sorted({len(spec.trials(m)) for m in spec.tuned_methods()})
        budget = (f"a grid of {'–'.join(map(str, trials))} trials" if t.sampler == "grid" else
                  f"{t.trials} trials drawn by Optuna's RandomSampler (seed {t.sampler_seed})")
        rule = "at the last round" if t.select == "last" else "at each seed's best validation round"
        untuned = [m for m in spec.methods if m not in spec.tuned_methods()]
        rest = (f"; {', '.join(spec.method_label(m) for m in untuned)} ran untuned, as the spec sets them"
                if untuned else "")
        return (f"Tuned: {_tuned_keys(spec)} searched per method and scenario ({budget}) with tuning seeds "
                f"{', '.join(map(str, t.seeds))}, none of them a final seed, and chosen by the highest mean "
                f"validation accuracy {rule}; the final seeds {', '.join(map(str, spec.seeds))} ran with the "
                f"chosen values{rest}. No choice was made on test data.")
    return {"shared": "Shared settings: every method trains with the spec's training settings and its "
                      "hyper-parameters as the spec gives them; nothing was tuned.",
            "paper": "Paper settings: each method's hyper-parameters are those its paper publishes (the spec's "
                     "comments say where a value is a reading or a guess); nothing was tuned here.",
            None: "Not stated by the spec (its protocol: key): every method ran with the settings the spec "
                  "gives it; nothing was tuned."}[spec.protocol]


def _kv_text(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or DASH


def _utc(stamp: str) -> str:
    """An ISO timestamp from timing.json as `YYYY-MM-DD HH:MM UTC`."""
    return stamp[:16].replace("T", " ") + " UTC"


def _hp_text(hyperparams: str) -> str:
    hp = json.loads(hyperparams) if hyperparams else {}
    return ", ".join(f"{k}={v}" for k, v in hp.items()) or DASH


def keyed_axes(spec) -> dict:
    """The keyed evaluation axes (fl/axes SCENARIO_AXES) some scenario of the spec names."""
    return {key: axis for key, axis in scenario_axes().items()
            if any(getattr(sc, key) is not None for sc in spec.scenarios.values())}


def held_out_text(sc) -> str:
    """What a scenario's `new_clients` holds out, in words ("none" without it)."""
    if sc.new_clients is None:
        return "none"
    return (f"{sc.new_client_count()} of {sc.clients} clients held out: never trained with, placed by each "
            f"method's rule at every full evaluation")


def moves_text(sc) -> str:
    """What a scenario's `drift` moves and when, in words ("none" without it)."""
    if sc.drift is None:
        return "none"
    return ", ".join(f"{sc.drift_count(e)} of {sc.clients} clients in round {e.round}" for e in sc.drift)


def _mean_of(values: dict[int, float]) -> float | None:
    """The mean of a method's seeds' values, None where no seed has one."""
    finite = [v for v in values.values() if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def _together(labels: list[str]) -> str:
    """"A", "A and B", "A, B and C"."""
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]
