"""`cflpipe report`: one self-contained HTML page (`results/report/index.html`) and paper-style
tables (`results/report/tables/summary.{csv,md,tex}`).

The report reads only files the pipeline wrote: `results/aggregate/*` (from `cflpipe
aggregate`), each scenario's partition `stats.parquet`, and one seed's `clusters.parquet` per
clustered method. It never trains. The page works offline: the plotly.js bundle is inlined once,
every figure is a `<div class="cfl-fig">` plus a JSON `<script type="application/json">` drawn by
one small script at the end of the page (a figure that fails to draw logs `console.error` and
shows the error in place; figures inside a collapsed `<details>` are drawn when it is first
opened). Figure ids are derived from their content's position, and no timestamp is written, so
the same inputs give the same bytes (wall-clock figures aside).

Sections (element ids), results first: setup, accuracy (personalized and global accuracy and
training loss per round), comparison (paper tables), ranking (average rank over scenarios,
Friedman test, Nemenyi critical-difference diagram; report/ranks.py), clients (each client's
final accuracy per method), clustering, communication (accuracy vs cumulative bytes, bytes per
round and in total, time), intra-inter, sweeps, and last overview: each scenario's facts with its
label histogram collapsed. Byte axes start at 0 in the unit (B, kB, MB, GB) that fits their
largest value. The setup section states what was trained (per scenario: model, local
steps, lr, batch, clients per round, momentum, rounds, partition seed; per method: its training
overrides and hyper-parameters, those from the scenario's `hyperparams` apart), how (cflpipe,
torch and python versions, requested and used devices, the spec's hash) and when and from which
git commit the runs finished (from timing.json, like the wall-clock figures). Every method has one
style for the whole report (report/styles.py), shown in a key there.
"""

from __future__ import annotations

import json
import os
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cflpipe import __version__, store
from cflpipe.errors import CflpipeError
from cflpipe.partition import small_test_sets
from cflpipe.report.aggregate import aggregate_dir, per_seed_frame, read_aggregate
from cflpipe.report.ranks import Ranking, q_alpha, rank_methods
from cflpipe.report.styles import FAMILY_TITLES, assign_styles, family_order
from cflpipe.report.tables import (ALPHA, DASH, TIE_MARK, PaperTable, format_mean_std, is_clustered, is_reference,
                                   mark_best, paper_tables, seed_values, table_specs, write_tables)
from cflpipe.spec import TRAINING_KEYS, Spec, Training, merge_training, spec_sha256

SECTIONS = (("setup", "Setup"), ("accuracy", "Accuracy & loss vs round"), ("comparison", "Final comparison"),
            ("ranking", "Average rank"), ("clients", "Per-client accuracy"), ("clustering", "Clustering"),
            ("communication", "Communication & time"), ("intra-inter", "Intra- vs inter-cluster accuracy"),
            ("sweeps", "Hyper-parameter sweeps"), ("overview", "Scenarios & labels"))
# The figure methods are ranked by across scenarios (mean over seeds; higher is better).
RANK_FIGURE, RANK_FIGURE_TITLE = "acc_macro", "personalized accuracy (acc macro)"
# Per-client box plots draw every client as a point up to this many clients, outliers only beyond.
MAX_BOX_POINTS = 200
# Decimal units for byte axes: the largest that shows the figure's largest value as at least 1.
BYTE_UNITS = ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"))
# Hyper-parameters named here are swept first and titled with their symbol.
SWEEP_SYMBOLS = {"beta": "β", "mu": "μ", "alpha": "α", "lambda": "λ", "lam": "λ", "tau": "τ"}
# Colours of traces that are not methods (bytes down/up, a sweep's accuracy and ARI); every
# method has its own style (report/styles.py).
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd")
CLUSTER_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                  "#9c755f", "#bab0ac", "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")
PLOT_CONFIG = {"responsive": True, "displaylogo": False, "showLink": False,
               "modeBarButtonsToRemove": ["sendDataToCloud"]}
# Columns of the per-scenario detail tables: (figure, header, scale, digits, direction) where
# direction +1 marks the highest mean best, -1 the lowest, 0 marks nothing.
DETAIL_COLUMNS = (
    ("acc_macro", "acc macro %", 100, 1, 1), ("acc_micro", "acc micro %", 100, 1, 1),
    ("acc_worst10", "worst-10% acc %", 100, 1, 1), ("global_acc_mean", "global acc %", 100, 1, 1),
    ("f1_macro", "F1 macro", 1, 3, 1), ("f1_micro", "F1 micro", 1, 3, 1), ("ari", "ARI", 1, 3, 1),
    ("nmi", "NMI", 1, 3, 1), ("n_clusters", "clusters", 1, 1, 0), ("intra_acc", "intra %", 100, 1, 1),
    ("inter_acc", "inter %", 100, 1, 0), ("bytes_total", "MB total", 1e-6, 2, -1),
    ("seconds_per_round", "s / round", 1, 3, -1),
)


# --------------------------------------------------------------------------- figures


@dataclass
class Figure:
    id: str
    json: str
    height: int
    title: str = ""


class Figures:
    """Collects plotly figures as JSON for the page; ids are sequential and deterministic."""

    def __init__(self):
        self.count = 0

    def add(self, fig, name: str, height: int = 380, margin: dict | None = None) -> Figure:
        import plotly.io as pio

        self.count += 1
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        margin = {"l": 60, "r": 20, "t": 50, "b": 50, **(margin or {})}
        fig.update_layout(template=_TEMPLATE, margin=margin)
        entries = [t.name or "" for t in fig.data if t.showlegend is not False and t.type not in ("heatmap",)]
        if entries and fig.layout.showlegend is not False:
            legend, extra = legend_below(entries)
            height += extra
            fig.update_layout(legend=legend, margin=dict(b=margin["b"] + extra))
        fig.update_layout(height=height)
        text = pio.to_json(fig, validate=False, pretty=False, remove_uids=True)
        # Inside <script type="application/json">: never let the text close the element.
        text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        title = fig.layout.title.text or ""
        return Figure(f"fig-{self.count:03d}-{slug}", text, height, title)


# Legends sit below the plot, never beside or inside it: with many methods a side legend gets
# taller than the plot and scrolls. Entries have one width (the longest name's), so the rows can
# be counted before the browser lays them out; the figure grows by the legend's height.
LEGEND_FONT_PX = 6.6   # mean advance of a 12 px system-ui character
LEGEND_SYMBOL_PX = 46  # the line-and-marker sample and its gap
LEGEND_ROW_PX = 21
# The narrowest plot area of a figure in the page's grid (520 px column less the margins).
LEGEND_WIDTH_PX = 430


def legend_below(names: list[str]) -> tuple[dict[str, Any], int]:
    """Plotly legend settings that put `names` in rows under the plot, and the height they need."""
    text = int(8 + LEGEND_FONT_PX * max(len(n) for n in names))  # plotly's entrywidth: the text part
    per_row = max(1, LEGEND_WIDTH_PX // (text + LEGEND_SYMBOL_PX))
    rows = math.ceil(len(names) / per_row)
    extra = 16 + LEGEND_ROW_PX * rows
    # yref container: placed from the bottom edge of the figure, below the x-axis title, whatever
    # the plot's height; the bottom margin grows by the legend's height so the two never overlap.
    return dict(orientation="h", x=0, xanchor="left", y=0, yanchor="bottom", yref="container",
                entrywidth=text, entrywidthmode="pixels", bgcolor="rgba(255,255,255,0)",
                tracegroupgap=0), extra


def _template():
    import plotly.graph_objects as go

    return go.layout.Template(layout=go.Layout(
        font=dict(family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=12, color="#222"),
        paper_bgcolor="white", plot_bgcolor="white", colorway=list(COLORS), hovermode="closest",
        title=dict(x=0.02, font=dict(size=14)),
        xaxis=dict(gridcolor="#e5e5e5", linecolor="#999", zeroline=False, ticks="outside", automargin=True),
        yaxis=dict(gridcolor="#e5e5e5", linecolor="#999", zeroline=False, ticks="outside", automargin=True),
        legend=dict(bgcolor="rgba(255,255,255,0.7)")))


_TEMPLATE = None


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _finite(values) -> np.ndarray:
    return np.asarray(values, dtype="float64")


def _clean(values) -> list:
    """Floats for JSON with NaN as null (plotly draws a gap)."""
    return [None if not math.isfinite(v) else float(v) for v in _finite(values)]


def byte_unit(largest: float) -> tuple[float, str]:
    """(scale, unit name) for an axis of byte counts whose largest value is `largest`."""
    for size, name in BYTE_UNITS:
        if math.isfinite(largest) and largest >= size:
            return 1 / size, name
    return 1.0, "B"


# Round figures that only some methods record (rounds.parquet), plotted in the clustering section
# for the methods that have them: title, y-axis title, y-axis settings.
METHOD_CURVES: dict[str, tuple[str, str, dict | None]] = {
    "hopkins": ("Hopkins statistic of the clients' public outputs (FedTSDP clusters above h_th)", "H",
                dict(range=[0, 1.02])),
    "clustering_ran": ("share of seeds whose server clustered in the round (FedTSDP)", "share",
                       dict(range=[-0.02, 1.02])),
    "shared_layers": ("number of shared layers (FedTSDP; the rest are personalization layers)", "layers",
                      dict(rangemode="tozero")),
    "fedac_clusters": ("FedAC: number of cluster models", "clusters", dict(rangemode="tozero")),
    "flow_nll": ("FCCA: cINN training loss (Eq. 3, mean over the round's clients)", "NLL", None),
}


class Report:
    def __init__(self, spec: Spec, tables: dict[str, pd.DataFrame]):
        global _TEMPLATE
        if _TEMPLATE is None:
            _TEMPLATE = _template()
        self.spec = spec
        self.runs, self.curves, self.summary, self.timing, self.final_clients = (
            tables[k] for k in ("runs", "curves", "summary", "timing", "final_clients"))
        self.per_seed = per_seed_frame(self.runs, self.timing)
        self.figures = Figures()
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

    # ------------------------------------------------------------------ helpers

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
        return self.spec.scenarios[scenario].group_step() is not None

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

    # ------------------------------------------------------------------ figures

    def curve_figure(self, scenario: str, figure: str, title: str, ytitle: str, scale: float = 1.0,
                     methods: list[str] | None = None, eval_only: bool = True, band: bool = True,
                     height: int = 380, yaxis: dict | None = None) -> Figure | None:
        import plotly.graph_objects as go

        fig = go.Figure()
        for m in self.plot_order(methods if methods is not None else self.methods_on(scenario)):
            rows = self.curve(scenario, m, figure, eval_only)
            if rows is None:
                continue
            x = rows["round"].astype(int).tolist()
            mean = rows[f"{figure}_mean"].to_numpy(dtype=float) * scale
            std = rows[f"{figure}_std"].to_numpy(dtype=float) * scale
            style, name = self.styles[m], self.label(m)
            if band and len(x) > 0 and np.any(np.nan_to_num(std) > 0):
                spread = np.nan_to_num(std)
                fig.add_trace(go.Scatter(x=x + x[::-1],
                                         y=_clean(np.concatenate([mean + spread, (mean - spread)[::-1]])),
                                         fill="toself", fillcolor=_rgba(style.color, 0.15), line=dict(width=0),
                                         mode="lines", hoverinfo="skip", showlegend=False, legendgroup=m,
                                         name=f"{name} ± std"))
            # Markers on every point of short curves, every few points of long ones: a method is
            # told apart by colour, dash and marker (styles.py).
            every = max(1, len(x) // 20)
            fig.add_trace(go.Scatter(x=x, y=_clean(mean), mode="lines+markers", name=name, legendgroup=m,
                                     line=dict(color=style.color, width=2, dash=style.dash),
                                     marker=dict(size=7, symbol=style.marker, color=style.color,
                                                 maxdisplayed=0 if every == 1 else math.ceil(len(x) / every)),
                                     customdata=_clean(std),
                                     # one seed: no std to show (a null would print as NaN)
                                     hovertemplate=f"{_hover(name)}<br>round %{{x}}<br>%{{y:.4g}}"
                                                   + (" ± %{customdata:.3g}" if np.isfinite(std).any() else "")
                                                   + "<extra></extra>"))
        if not fig.data:
            return None
        fig.update_layout(title=title, showlegend=True,
                          xaxis=_round_axis(sorted({x for t in fig.data for x in t.x})),
                          yaxis={"title": ytitle, **(yaxis or {})})
        return self.figures.add(fig, f"{scenario}-{figure}", height)

    def label_heatmap(self, scenario: str) -> Figure | None:
        import plotly.graph_objects as go

        stats = self.stats[scenario]
        if stats is None or not len(stats):
            return None
        stats = stats.sort_values(["group", "client"], kind="stable")
        labels = sorted((c for c in stats.columns if c.startswith("label_")), key=lambda c: int(c[6:]))
        grouped = bool((stats["group"] >= 0).any())
        names = [f"c{int(c)} · g{int(g)}" if grouped else f"c{int(c)}"
                 for c, g in zip(stats["client"], stats["group"])]
        counts = stats[labels].to_numpy(dtype=float)
        totals = counts.sum(axis=1, keepdims=True)
        share = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
        # Colour: share of the client's samples (label skew stays visible when sizes differ a lot).
        fig = go.Figure(go.Heatmap(z=share, x=[c[6:] for c in labels], y=names, colorscale="Blues", zmin=0,
                                   customdata=counts, colorbar=dict(title="share", tickformat=".0%"),
                                   hovertemplate="client %{y}<br>label %{x}<br>%{customdata:.0f} samples "
                                                 "(%{z:.0%})<extra></extra>"))
        shapes = self._group_lines(stats["group"].to_numpy(), len(labels)) if grouped else []
        fig.update_layout(title=f"{self.scenario_labels[scenario]}: label share of each client's samples (sorted by group)",
                          xaxis=dict(title="label", type="category"),
                          yaxis=dict(title="client", autorange="reversed", type="category"), shapes=shapes)
        return self.figures.add(fig, f"{scenario}-labels", _rows_height(len(stats)))

    @staticmethod
    def _group_lines(groups: np.ndarray, width: int) -> list[dict]:
        edges = np.nonzero(np.diff(groups))[0]
        return [dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=e + 0.5, y1=e + 0.5,
                     line=dict(color="#d62728", width=1.5)) for e in edges]

    def assignment_heatmap(self, scenario: str, method: str) -> tuple[Figure | None, str | None]:
        import plotly.graph_objects as go

        matrix = set(self.spec.matrix())
        seed = next((k for k in self.spec.seeds if (scenario, method, k) in matrix), None)
        if seed is None:
            return None, None
        path = self.spec.run_dir(scenario, method, seed) / "clusters.parquet"
        if not path.is_file():
            return None, f"{self.label(method)}: {path} is missing, so there is no assignment heatmap"
        clusters = store.read_parquet(path)
        if not len(clusters):
            return None, f"{self.label(method)}: no clustering checkpoint in {path}"
        table = clusters.pivot(index="client", columns="round", values="cluster")
        groups = clusters.drop_duplicates("client").set_index("client")["true_group"]
        order = sorted(table.index, key=lambda c: (int(groups.get(c, -1)), int(c)))
        table = table.loc[order]
        grouped = bool((groups >= 0).any())
        names = [f"c{int(c)} · g{int(groups[c])}" if grouped else f"c{int(c)}" for c in order]
        z = table.to_numpy(dtype=float)
        k = int(np.nanmax(z)) + 1 if np.isfinite(z).any() else 1
        fig = go.Figure(go.Heatmap(
            z=z, x=[str(r) for r in table.columns], y=names, colorscale=_discrete_scale(k), zmin=-0.5,
            zmax=k - 0.5, colorbar=dict(title="cluster", tickvals=list(range(k)) if k <= 16 else None),
            xgap=1, hovertemplate="client %{y}<br>round %{x}<br>cluster %{z}<extra></extra>"))
        shapes = self._group_lines(np.array([int(groups[c]) for c in order]), len(table.columns)) if grouped else []
        fig.update_layout(title=f"{self.scenario_labels[scenario]} · {self.label(method)} (seed {seed}): client clusters per round",
                          xaxis=dict(title="round", type="category"),
                          yaxis=dict(title="client" + (" (sorted by true group)" if grouped else ""),
                                     autorange="reversed", type="category"), shapes=shapes)
        return self.figures.add(fig, f"{scenario}-{method}-assignment", _rows_height(len(order))), None

    def similarity_heatmap(self, scenario: str, method: str) -> Figure | None:
        """The server's client-similarity matrix at the last evaluation round (FCCA's D, the
        paper's Fig. 2) of the first seed, clients sorted by true group, for methods that write
        similarity.parquet."""
        import plotly.graph_objects as go

        matrix = set(self.spec.matrix())
        seed = next((k for k in self.spec.seeds if (scenario, method, k) in matrix), None)
        run_dir = self.spec.run_dir(scenario, method, seed) if seed is not None else None
        if run_dir is None or not (run_dir / "similarity.parquet").is_file():
            return None
        table = store.read_parquet(run_dir / "similarity.parquet")
        if not len(table):
            return None
        last = int(table["round"].max())
        square = table[table["round"] == last].pivot(index="client", columns="other", values="value")
        groups = pd.Series(-1, index=square.index)
        if (run_dir / "clusters.parquet").is_file():
            known = store.read_parquet(run_dir / "clusters.parquet").drop_duplicates("client")
            groups = known.set_index("client")["true_group"].reindex(square.index, fill_value=-1)
        order = sorted(square.index, key=lambda c: (int(groups[c]), int(c)))
        grouped = bool((groups >= 0).any())
        names = [f"c{int(c)} · g{int(groups[c])}" if grouped else f"c{int(c)}" for c in order]
        z = square.loc[order, order].to_numpy(dtype=float)
        fig = go.Figure(go.Heatmap(z=z, x=names, y=names, colorscale="Viridis", colorbar=dict(title="D"),
                                   hovertemplate="client %{y}<br>client %{x}<br>D = %{z:.3f}<extra></extra>"))
        shapes = []
        if grouped:
            for e in np.nonzero(np.diff([int(groups[c]) for c in order]))[0]:
                line = dict(color="#d62728", width=1.5)
                shapes += [dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=e + 0.5, y1=e + 0.5, line=line),
                           dict(type="line", yref="paper", y0=0, y1=1, xref="x", x0=e + 0.5, x1=e + 0.5, line=line)]
        fig.update_layout(title=f"{self.scenario_labels[scenario]} · {self.label(method)} (seed {seed}): server similarity D at round {last}"
                                + (" (sorted by true group)" if grouped else ""),
                          xaxis=dict(type="category", showticklabels=len(order) <= 40),
                          yaxis=dict(type="category", autorange="reversed", showticklabels=len(order) <= 40),
                          shapes=shapes)
        return self.figures.add(fig, f"{scenario}-{method}-similarity", max(420, _rows_height(len(order))))

    def communication_figures(self, scenario: str) -> list[Figure]:
        import plotly.graph_objects as go

        # Axes start at 0 in a unit that fits the largest value: methods that send the same model
        # differ by a few bytes of bookkeeping at most, which must not fill the plot's height.
        scale, unit = byte_unit(max(self.largest(scenario, "bytes_down"), self.largest(scenario, "bytes_up")))
        figs = [self.accuracy_bytes_figure(scenario),
                self.curve_figure(scenario, "bytes_down", f"{self.scenario_labels[scenario]}: bytes down per round (server → clients)",
                                  unit, scale, eval_only=False, band=False, height=330, yaxis=dict(rangemode="tozero")),
                self.curve_figure(scenario, "bytes_up", f"{self.scenario_labels[scenario]}: bytes up per round (clients → server)",
                                  unit, scale, eval_only=False, band=False, height=330, yaxis=dict(rangemode="tozero"))]
        methods = self.methods_on(scenario)
        names = [self.label(m) for m in methods]
        rows = [self.summary_row(scenario, m) for m in methods]
        scale, unit = byte_unit(max([float(r[f"bytes_{d}_total_mean"]) for r in rows for d in ("down", "up")
                                     if math.isfinite(float(r[f"bytes_{d}_total_mean"]))] + [0.0]))
        fig = go.Figure()
        for direction, colour in (("down", "#4e79a7"), ("up", "#f28e2b")):
            fig.add_trace(go.Bar(x=names, y=_clean([r[f"bytes_{direction}_total_mean"] * scale for r in rows]),
                                 name=direction, marker_color=colour,
                                 error_y=dict(type="data", array=_clean([r[f"bytes_{direction}_total_std"] * scale
                                                                        for r in rows]))))
        fig.update_layout(title=f"{self.scenario_labels[scenario]}: total bytes over all rounds", yaxis_title=unit,
                          yaxis_rangemode="tozero", barmode="group")
        figs.append(self.figures.add(fig, f"{scenario}-bytes-total", 330))
        fig = go.Figure(go.Bar(x=names, y=_clean([r["seconds_per_round_mean"] for r in rows]),
                               marker_color=[self.color[m] for m in methods],
                               error_y=dict(type="data", array=_clean([r["seconds_per_round_std"] for r in rows])),
                               hovertemplate="%{x}: %{y:.3g} s/round<extra></extra>"))
        devices = sorted(set(self.timing.loc[self.timing["scenario"] == scenario, "device"].astype(str)) - {""})
        fig.update_layout(title=f"{self.scenario_labels[scenario]}: wall-clock time per round" + (f" ({', '.join(devices)})" if devices
                                                                             else ""),
                          yaxis_title="seconds / round")
        figs.append(self.figures.add(fig, f"{scenario}-seconds", 330))
        return [f for f in figs if f is not None]

    def intra_inter_figure(self, scenario: str) -> Figure | None:
        import plotly.graph_objects as go

        fig = go.Figure()
        lo, hi = 100.0, 0.0
        for m in self.plot_order(self.methods_on(scenario)):
            r = self.summary_row(scenario, m)
            x, y = r["inter_acc_mean"] * 100, r["intra_acc_mean"] * 100
            if not (math.isfinite(x) and math.isfinite(y)):
                continue
            lo, hi = min(lo, x, y), max(hi, x, y)
            style, name = self.styles[m], self.label(m)
            fig.add_trace(go.Scatter(
                x=[x], y=[y], mode="markers+text", text=[name], textposition="top center", name=name,
                marker=dict(size=11, color=style.color, symbol=style.marker),
                error_x=dict(type="data", array=_clean([r["inter_acc_std"] * 100]), color=style.color),
                error_y=dict(type="data", array=_clean([r["intra_acc_std"] * 100]), color=style.color),
                hovertemplate=f"{_hover(name)}<br>inter %{{x:.2f}}%<br>intra %{{y:.2f}}%<extra></extra>"))
        if not fig.data:
            return None
        pad = max(2.0, 0.1 * (hi - lo))
        lo, hi = max(0.0, lo - pad), min(100.0, hi + pad)
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#999", dash="dot"),
                                 name="intra = inter", hoverinfo="skip"))
        fig.update_layout(title=f"{self.scenario_labels[scenario]}: accuracy on the own group's data (intra) vs the other groups' (inter)",
                          xaxis=dict(title="inter-cluster accuracy %", range=[lo, hi]),
                          yaxis=dict(title="intra-cluster accuracy %", range=[lo, hi]))
        return self.figures.add(fig, f"{scenario}-intra-inter", 420)

    def sweep_figure(self, sweep: "Sweep") -> Figure:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        rows = [self.summary_row(sweep.scenario, m) for m in sweep.methods]
        acc = [r["acc_macro_mean"] * 100 for r in rows]
        ari = [r["ari_mean"] for r in rows]
        clustered = self.clustered_methods(sweep.scenario)
        has_ari = any(math.isfinite(v) for v in ari) and any(m in clustered for m in sweep.methods)
        fig = make_subplots(specs=[[{"secondary_y": has_ari}]])
        hover = [self.label(m) for m in sweep.methods]
        fig.add_trace(go.Scatter(x=sweep.values, y=_clean(acc), mode="lines+markers", name="acc macro %",
                                 text=hover, line=dict(color=COLORS[0]),
                                 error_y=dict(type="data", array=_clean([r["acc_macro_std"] * 100 for r in rows])),
                                 hovertemplate="%{text}: %{y:.2f}%<extra></extra>"), secondary_y=False)
        if has_ari:
            fig.add_trace(go.Scatter(x=sweep.values, y=_clean(ari), mode="lines+markers", name="ARI", text=hover,
                                     line=dict(color=COLORS[1], dash="dash"),
                                     error_y=dict(type="data", array=_clean([r["ari_std"] for r in rows])),
                                     hovertemplate="%{text}: ARI %{y:.3f}<extra></extra>"), secondary_y=True)
            low = min([0.0] + [v for v in ari if math.isfinite(v)])
            fig.update_yaxes(title_text="ARI", secondary_y=True, showgrid=False, range=[low - 0.05, 1.05],
                             tickmode="linear", tick0=0, dtick=0.25)
        positive = all(v > 0 for v in sweep.values)
        log = positive and max(sweep.values) / min(sweep.values) >= 100
        fig.update_xaxes(title_text=sweep.symbol, type="log" if log else "linear")
        fig.update_yaxes(title_text="personalized accuracy %", secondary_y=False)
        fig.update_layout(title=f"{self.scenario_labels[sweep.scenario]}: {sweep.method_type} vs {sweep.symbol}")
        return self.figures.add(fig, f"{sweep.scenario}-{sweep.method_type}-{sweep.param}-sweep", 360)

    def largest(self, scenario: str, figure: str) -> float:
        """The largest per-round mean of `figure` of any method on `scenario` (0 when none)."""
        rows = self.curves[self.curves["scenario"] == scenario] if len(self.curves) else self.curves
        if f"{figure}_mean" not in rows.columns:
            return 0.0
        values = rows[f"{figure}_mean"].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        return float(values.max()) if len(values) else 0.0

    def loss_figure(self, scenario: str) -> Figure | None:
        """Training loss per round; on a log axis when it spans a decade or more (then without
        bands: mean − std is often below 0 there)."""
        values = []
        for m in self.methods_on(scenario):
            rows = self.curve(scenario, m, "train_loss", eval_only=False)
            if rows is not None:
                values += [v for v in rows["train_loss_mean"].to_numpy(dtype=float) if math.isfinite(v)]
        if not values:
            return None
        log = min(values) > 0 and max(values) / min(values) >= 10
        return self.curve_figure(scenario, "train_loss", f"{self.scenario_labels[scenario]}: training loss (mean over seeds"
                                 + (")" if log else " ± std)"),
                                 "training loss" + (" (log scale)" if log else ""), eval_only=False, band=not log,
                                 yaxis=dict(type="log", dtick=1) if log else dict(rangemode="tozero"))

    def accuracy_bytes_figure(self, scenario: str) -> Figure | None:
        """Personalized accuracy at each evaluated round against the bytes sent (up + down) up to it."""
        import plotly.graph_objects as go

        series = [(m, rows) for m in self.plot_order(self.methods_on(scenario))
                  if (rows := self.curve(scenario, m, "acc_macro")) is not None and "bytes_cumulative_mean" in rows.columns]
        if not series:
            return None
        scale, unit = byte_unit(max(float(np.nanmax(rows["bytes_cumulative_mean"].to_numpy(dtype=float)))
                                    for _, rows in series))
        fig = go.Figure()
        for m, rows in series:
            style, name = self.styles[m], self.label(m)
            fig.add_trace(go.Scatter(
                x=_clean(rows["bytes_cumulative_mean"].to_numpy(dtype=float) * scale),
                y=_clean(rows["acc_macro_mean"].to_numpy(dtype=float) * 100), mode="lines+markers", name=name,
                legendgroup=m, line=dict(color=style.color, width=2, dash=style.dash),
                marker=dict(size=7, symbol=style.marker, color=style.color), cliponaxis=False,  # Local's 0 bytes
                customdata=rows["round"].astype(int).tolist(),
                hovertemplate=f"{_hover(name)}<br>round %{{customdata}}<br>%{{x:.4g}} {unit} sent<br>%{{y:.2f}}%"
                              "<extra></extra>"))
        fig.update_layout(title=f"{self.scenario_labels[scenario]}: personalized accuracy vs bytes sent so far (mean over seeds)",
                          showlegend=True, xaxis=dict(title=f"{unit} sent up to the round (down + up)", rangemode="tozero"),
                          yaxis=dict(title="accuracy %"))
        return self.figures.add(fig, f"{scenario}-accuracy-bytes")

    def client_accuracy(self, scenario: str, method: str) -> pd.Series:
        """Each client's final test accuracy (%), mean over seeds; clients without test samples left out."""
        rows = self.final_clients[(self.final_clients["scenario"] == scenario) & (self.final_clients["method"] == method)
                                  & (self.final_clients["n"] > 0)]
        return rows.groupby("client", sort=True)["acc"].mean() * 100

    def client_accuracy_figure(self, scenario: str) -> Figure | None:
        """One horizontal box per method of its clients' final accuracy; the box's dashed line is
        the mean over clients, i.e. acc macro (mean over seeds)."""
        import plotly.graph_objects as go

        fig = go.Figure()
        for m in self.plot_order(self.methods_on(scenario)):
            values = self.client_accuracy(scenario, m)
            if not len(values):
                continue
            style, name = self.styles[m], self.label(m)
            fig.add_trace(go.Box(
                x=values.to_numpy(dtype=float).tolist(), y=[name] * len(values), name=name, orientation="h",
                boxmean=True, boxpoints="all" if len(values) <= MAX_BOX_POINTS else "outliers", jitter=0.6,
                pointpos=0, line=dict(color=style.color, width=1.5), fillcolor=_rgba(style.color, 0.12),
                marker=dict(color=style.color, symbol=style.marker, size=5, opacity=0.75),
                text=[f"client {int(c)}" for c in values.index], hoveron="boxes+points",
                hoverinfo="x+text", showlegend=False))
        if not fig.data:
            return None
        fig.update_layout(title=f"{self.scenario_labels[scenario]}: final accuracy of each client (its mean over seeds)",
                          showlegend=False, xaxis=dict(title="client accuracy %"),
                          yaxis=dict(type="category", autorange="reversed", title=None))
        return self.figures.add(fig, f"{scenario}-client-accuracy", 110 + 30 * len(fig.data))

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

    def ranking(self) -> dict[str, Any]:
        scores, excluded = self.rank_scores()
        ranking = rank_methods(scores, excluded, RANK_FIGURE) if scores.shape[1] else None
        out: dict[str, Any] = {"figure_title": RANK_FIGURE_TITLE, "alpha": None, "rows": [], "scenarios": [],
                               "test": None, "notes": [], "figure": None,
                               "excluded": self._by_reason(excluded)}
        if ranking is None:
            out["notes"].append("Fewer than two methods ran on every scenario: there is nothing to rank.")
            return out
        out["excluded"] = self._by_reason(ranking.excluded)
        out["scenarios"] = [self.scenario_labels.get(s, s) for s in ranking.scenarios]
        out["alpha"] = f"{ranking.alpha:g}"
        for m in ranking.average.sort_values(kind="stable").index:
            out["rows"].append({"method": self.label(m), "average": f"{ranking.average[m]:.2f}",
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
            out["figure"] = self.cd_diagram(ranking)
        return out

    def _by_reason(self, excluded: dict[str, str]) -> list[tuple[str, str]]:
        """(reason, methods) with the methods that share a reason listed together."""
        groups: dict[str, list[str]] = {}
        for m, why in excluded.items():
            groups.setdefault(why, []).append(self.label(m))
        return [(why, ", ".join(names)) for why, names in groups.items()]

    def cd_diagram(self, ranking: Ranking) -> Figure:
        """Demšar's critical-difference diagram: the rank axis (1 = best, left), each method's
        average rank joined to its label (the better half on the left, the worse on the right),
        and a thick bar under every group of methods that do not differ significantly."""
        import plotly.graph_objects as go

        order = ranking.average.sort_values(kind="stable")
        k = len(order)
        names = list(order.index)
        half = math.ceil(k / 2)
        # Top to bottom: the outermost method first, so no label line crosses another one's.
        sides = [("left", m, i) for i, m in enumerate(names[:half])] + \
                [("right", m, i) for i, m in enumerate(names[half:][::-1])]
        lo, hi, pad = 1.0, float(k), 0.3
        bar_y = [-0.3 - 0.22 * i for i in range(len(ranking.groups))]
        top_row = min(bar_y, default=-0.1) - 0.45
        step = 0.5
        fig = go.Figure()
        line = dict(color="#222", width=1.2)
        shapes = [dict(type="line", x0=lo, x1=hi, y0=0, y1=0, line=line)]
        annotations = []
        for i in range(1, k + 1):
            shapes.append(dict(type="line", x0=i, x1=i, y0=0, y1=0.14, line=line))
            annotations.append(dict(x=i, y=0.16, text=str(i), showarrow=False, yanchor="bottom"))
            if i < k:
                shapes.append(dict(type="line", x0=i + 0.5, x1=i + 0.5, y0=0, y1=0.07, line=line))
        cd_end = min(lo + ranking.cd, hi + pad)
        cd_y = 0.75
        shapes += [dict(type="line", x0=lo, x1=cd_end, y0=cd_y, y1=cd_y, line=dict(color="#222", width=2)),
                   dict(type="line", x0=lo, x1=lo, y0=cd_y - 0.07, y1=cd_y + 0.07, line=line),
                   dict(type="line", x0=cd_end, x1=cd_end, y0=cd_y - 0.07, y1=cd_y + 0.07, line=line)]
        annotations.append(dict(x=(lo + cd_end) / 2, y=cd_y + 0.05, text=f"CD = {ranking.cd:.2f}", showarrow=False,
                                yanchor="bottom"))
        for group, y in zip(ranking.groups, bar_y):
            shapes.append(dict(type="line", x0=float(order[group[0]]) - 0.04, x1=float(order[group[-1]]) + 0.04, y0=y,
                               y1=y, line=dict(color="#222", width=4)))
        for side, m, i in sides:
            rank, y = float(order[m]), top_row - step * i
            edge = lo - pad if side == "left" else hi + pad
            style, name = self.styles[m], self.label(m)
            fig.add_trace(go.Scatter(x=[rank, rank, edge], y=[0, y, y], mode="lines+markers", name=name,
                                     showlegend=False, line=dict(color=style.color, dash=style.dash, width=1.5),
                                     marker=dict(symbol=style.marker, color=style.color, size=[10, 0, 0]),
                                     hovertemplate=f"{_hover(name)}: average rank {rank:.2f}<extra></extra>"))
            annotations.append(dict(x=edge, y=y, text=f"{name} ({rank:.2f})" if side == "left" else f"({rank:.2f}) {name}",
                                    showarrow=False, xanchor="right" if side == "left" else "left",
                                    xshift=-4 if side == "left" else 4))
        bottom = top_row - step * (half - 1) - 0.3
        label = int(16 + LEGEND_FONT_PX * max(len(self.label(m)) + 7 for m in names))
        fig.update_layout(title=f"Average rank by {RANK_FIGURE_TITLE} over {len(ranking.scenarios)} scenarios "
                                f"(Nemenyi, α = {ranking.alpha:g}; bars join methods that do not differ)",
                          showlegend=False, shapes=shapes, annotations=annotations,
                          xaxis=dict(visible=False, range=[lo - pad, hi + pad], fixedrange=True),
                          yaxis=dict(visible=False, range=[bottom, 1.2], fixedrange=True))
        height = int(70 + 60 * (1.2 - bottom))
        return self.figures.add(fig, "ranking-cd", height, margin=dict(l=label, r=label, t=50, b=10))

    def clients(self) -> list[dict[str, Any]]:
        return [{"scenario": s, "label": self.scenario_labels[s], "figure": self.client_accuracy_figure(s)}
                for s in self.spec.scenarios]

    # ------------------------------------------------------------------ sections

    def scenario_training(self, scenario: str) -> Training:
        """The training settings of a scenario before any method's overrides."""
        return Training(**merge_training([self.spec.training.model_dump(), self.spec.scenarios[scenario].training]))

    def setup(self) -> dict[str, Any]:
        from cflpipe.methods import scenario_hyperparams

        names = [self.scenario_labels[s] for s in self.spec.scenarios]
        settings: dict[str, list[str]] = {}
        for s, sc in self.spec.scenarios.items():
            t = self.scenario_training(s)
            for what, value in (
                    ("dataset", sc.dataset.name + (f" ({', '.join(f'{k}={v}' for k, v in sc.dataset.params.items())})"
                                                   if sc.dataset.params else "")),
                    ("clients", sc.clients), ("partition", ", ".join(_step_text(step) for step in sc.partition)),
                    ("partition seed", sc.seed), ("model", t.model), ("rounds", t.rounds),
                    ("local work per round", _local_text(t)), ("batch size", t.batch_size),
                    ("lr", f"{t.lr:g}" + (f" (× {t.lr_decay:g} per round)" if t.lr_decay != 1 else "")),
                    ("momentum", f"{t.momentum:g}"), ("weight decay", f"{t.weight_decay:g}"),
                    ("clients per round", t.clients_per_round), ("evaluated every", f"{t.eval_every} rounds"),
                    ("device", t.device), ("trainer", t.trainer),
                    ("seeds", ", ".join(str(k) for k in self.spec.seeds)),
                    ("scenario hyperparams", _kv_text(sc.hyperparams))):
                settings.setdefault(what, []).append(str(value))
        methods = []
        for m in self.methods:
            ran = [s for s in self.spec.scenarios if m in self.methods_on(s)]
            if not ran:
                continue
            overrides, shared = {}, {}
            own = self.spec.methods[m].hyperparams
            for s in ran:
                base, resolved = self.scenario_training(s).model_dump(), self.spec.resolved_training(s, m).model_dump()
                overrides[s] = _kv_text({k: resolved[k] for k in TRAINING_KEYS if resolved[k] != base[k]})
                shared[s] = _kv_text({k: v for k, v in scenario_hyperparams(self.spec, s, m).items() if k not in own})
            methods.append({"method": self.label(m), "type": self.method_types[m],
                            "family": FAMILY_TITLES[self.styles[m].family],
                            "scenarios": ", ".join(self.scenario_labels[s] for s in ran)
                            if len(ran) < len(self.spec.scenarios) else "all",
                            "training": self._per_scenario(overrides), "hyperparams": _kv_text(own),
                            "from_scenario": self._per_scenario(shared)})
        return {"scenario_names": names, "settings": list(settings.items()), "methods": methods,
                "provenance": self.provenance(), "key": self.style_key()}

    def _per_scenario(self, texts: dict[str, str]) -> str:
        """One text when every scenario has it, else `text (scenarios); …` grouped by text."""
        if len(set(texts.values())) == 1:
            return next(iter(texts.values()))
        groups: dict[str, list[str]] = {}
        for s, text in texts.items():
            groups.setdefault(text, []).append(self.scenario_labels[s])
        return "; ".join(f"{text} ({', '.join(where)})" for text, where in groups.items())

    def provenance(self) -> list[tuple[str, str]]:
        """(what, value) rows: how and when the runs were made, from summary.json's provenance
        (runs.parquet) and timing.json (timing.parquet); "unknown" where a run did not record it."""
        runs, timing = self.runs, self.timing

        def values(frame: pd.DataFrame, column: str, unknown: str = "unknown") -> str:
            found = [str(v) for v in frame[column]] if column in frame.columns else [""] * len(frame)
            known = sorted(set(found) - {""})
            missing = found.count("")
            text = ", ".join(known) if known else unknown
            if known and missing:
                text += f" ({missing} of {len(found)} runs: {unknown})"
            return text

        now = spec_sha256(self.spec)
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

    def style_key(self) -> Figure:
        """Every method entry with its line, dash and marker, grouped by family: the key to every figure."""
        import plotly.graph_objects as go

        fig = go.Figure()
        order = self.plot_order(self.methods)
        for m in order:
            style, name = self.styles[m], self.label(m)
            fig.add_trace(go.Scatter(x=[0, 1, 2], y=[name] * 3, mode="lines+markers", name=name, showlegend=False,
                                     line=dict(color=style.color, dash=style.dash, width=2.5),
                                     marker=dict(symbol=style.marker, size=9, color=style.color),
                                     hovertemplate=f"{_hover(name)} ({_hover(self.method_types[m])}): "
                                                   f"{FAMILY_TITLES[style.family]}<extra></extra>"))
        families = []
        for m in order:
            title = FAMILY_TITLES[self.styles[m].family]
            if not families or families[-1][0] != title:
                families.append((title, self.label(m)))
        annotations = [dict(x=2.15, y=first, xref="x", yref="y", text=title, showarrow=False, xanchor="left",
                            font=dict(color="#666")) for title, first in families]
        fig.update_layout(title="Method styles (the same in every figure), grouped by family", showlegend=False,
                          xaxis=dict(visible=False, range=[-0.15, 3.4]),
                          yaxis=dict(type="category", autorange="reversed", showgrid=False, ticks=""),
                          annotations=annotations)
        return self.figures.add(fig, "method-styles", 70 + 22 * len(order))

    def overview(self) -> list[dict[str, Any]]:
        out = []
        for name, sc in self.spec.scenarios.items():
            stats = self.stats[name]
            step = sc.group_step()
            item: dict[str, Any] = {
                "name": name, "dataset": sc.dataset.name,
                "dataset_params": ", ".join(f"{k}={v}" for k, v in sc.dataset.params.items()),
                "clients": sc.clients, "steps": [_step_text(s) for s in sc.partition],
                "groups": f"{step.groups} ({step.kind})" if step is not None else "none",
                "test_fraction": sc.test_fraction, "pool": sc.pool, "partition_seed": sc.seed,
                "methods": [self.label(m) for m in self.methods_on(name)], "label": self.scenario_labels[name],
                "seeds": sorted({int(k) for k in self.runs.loc[self.runs["scenario"] == name, "seed"]}),
                "rounds": sorted({int(r) for r in self.runs.loc[self.runs["scenario"] == name, "rounds"]}),
                "figure": self.label_heatmap(name), "note": None,
                "public": None if sc.public is None else
                f"{sc.public.size or 'all'} unlabeled samples of the {sc.public.source} split (never given to a client)",
            }
            if stats is not None:
                labels = [c for c in stats.columns if c.startswith("label_")]
                item.update(classes=len(labels), n_train=int(stats["n_train"].sum()),
                            n_test=int(stats["n_test"].sum()), note=small_test_sets(stats))
            else:
                item["note"] = (f"{self.spec.partition_dir(name) / 'stats.parquet'} is missing; run "
                                f"`cflpipe partition --config FILE --scenario {name}`")
            out.append(item)
        return out

    def accuracy(self) -> list[dict[str, Any]]:
        out = []
        for s in self.spec.scenarios:
            figs = [self.curve_figure(s, "acc_macro", f"{self.scenario_labels[s]}: personalized accuracy (mean ± std over seeds)",
                                      "accuracy %", 100),
                    self.curve_figure(s, "global_acc_mean", f"{self.scenario_labels[s]}: global accuracy (mean ± std over seeds)",
                                      "accuracy %", 100),
                    self.loss_figure(s)]
            out.append({"scenario": s, "label": self.scenario_labels[s], "figures": [f for f in figs if f is not None]})
        return out

    def clustering_methods(self) -> list[str]:
        """ARI table rows: methods that declare they cluster (those that never did are marked in
        the table, not dropped) or that had more than one cluster in some scenario."""
        return [m for m in self.methods if is_clustered(self.method_types[m])
                or any(m in self.clustered_methods(s) for s in self.spec.scenarios)]

    def never_clustered(self, scenario: str) -> list[str]:
        """One line per method that, in some seed, never clustered (summary.json's `degenerate`)."""
        if "degenerate" not in self.runs.columns:
            return []
        rows = self.runs[(self.runs["scenario"] == scenario) & (self.runs["degenerate"].fillna("") != "")]
        lines = []
        for m in self.methods_on(scenario):
            mine = rows[rows["method"] == m]
            if len(mine):
                seeds = int((self.runs["scenario"].eq(scenario) & self.runs["method"].eq(m)).sum())
                reasons = "; ".join(sorted(set(mine["degenerate"])))
                lines.append(f"{self.label(m)} never clustered in {len(mine)} of {seeds} seeds ({reasons}): its "
                             f"figures are those of the method without clusters, not of a clustering")
        return lines

    def comparison(self) -> tuple[list[PaperTable], list[dict[str, Any]]]:
        tables = paper_tables(self.per_seed, list(self.spec.scenarios), self.methods, self.method_types,
                              ari_methods=self.clustering_methods(), tables=table_specs(self.spec.report.tables),
                              method_labels=self.method_labels, scenario_labels=self.scenario_labels)
        details = []
        for s in self.spec.scenarios:
            methods = self.methods_on(s)
            columns = [c for c in DETAIL_COLUMNS if any(
                math.isfinite(float(self.summary_row(s, m)[f"{c[0]}_mean"])) for m in methods)]
            rows = []
            marks: dict[str, dict[str, tuple[str, float]]] = {}
            reference = {m for m in methods if is_reference(self.method_types[m])}
            for figure, _, scale, digits, direction in columns:
                pool = self.clustered_methods(s) if figure in ("ari", "nmi") else methods
                values = {m: seed_values(self.per_seed, s, m, figure, scale) for m in pool}
                marks[figure] = mark_best(values, direction, reference)
            for m in methods:
                r = self.summary_row(s, m)
                cells = []
                for f, _, sc, d, _ in columns:
                    mark = marks[f].get(m, ("", math.nan))[0]
                    cells.append({"text": format_mean_std(float(r[f"{f}_mean"]) * sc, float(r[f"{f}_std"]) * sc, d),
                                  "bold": mark == "best", "tied": mark == "tied"})
                rows.append({"method": self.label(m), "type": self.method_types[m], "seeds": int(r["seeds"]),
                             "hyperparams": _hp_text(r["hyperparams"]), "cells": cells})
            details.append({"scenario": s, "label": self.scenario_labels[s], "headers": [c[1] for c in columns],
                            "rows": rows})
        return tables, details

    def method_figures(self, scenario: str) -> list[Figure]:
        """Per-round figures a method records of its own (rounds.parquet columns), every round."""
        figs = []
        for figure, (title, ytitle, yaxis) in METHOD_CURVES.items():
            methods = [m for m in self.methods_on(scenario) if self.curve(scenario, m, figure, eval_only=True) is not None]
            if methods:
                figs.append(self.curve_figure(scenario, figure, f"{self.scenario_labels[scenario]}: {title}", ytitle, methods=methods,
                                              eval_only=False, yaxis=yaxis))
        return [f for f in figs if f is not None]

    def clustering(self) -> list[dict[str, Any]]:
        out = []
        for s in self.spec.scenarios:
            grouped = self.has_groups(s)
            clustered = self.clustered_methods(s)
            others = [m for m in self.methods_on(s) if m not in clustered]
            figs, notes = [], []
            if grouped and clustered:
                figs += [self.curve_figure(s, "ari", f"{self.scenario_labels[s]}: ARI vs true groups", "ARI", methods=clustered,
                                           yaxis=dict(range=[-0.05, 1.05])),
                         self.curve_figure(s, "nmi", f"{self.scenario_labels[s]}: NMI vs true groups", "NMI", methods=clustered,
                                           yaxis=dict(range=[-0.05, 1.05]))]
            elif grouped:
                notes.append("no method clusters clients here: ARI and NMI are 0 by construction")
            else:
                notes.append("no ground-truth groups: ARI and NMI are undefined for this scenario")
            most = max([self.max_clusters(s, m) for m in self.methods_on(s)] + [1.0])
            figs.append(self.curve_figure(s, "n_clusters", f"{self.scenario_labels[s]}: number of clusters (mean over seeds)",
                                          "clusters", yaxis=dict(rangemode="tozero", tick0=0,
                                                                 dtick=max(1, math.ceil(most / 8)))))
            figs += self.method_figures(s)
            heatmaps = []
            for m in clustered:
                fig, note = self.assignment_heatmap(s, m)
                if fig is not None:
                    heatmaps.append(fig)
                if note:
                    notes.append(note)
                similarity = self.similarity_heatmap(s, m)
                if similarity is not None:
                    heatmaps.append(similarity)
            if others:
                notes.append(f"one cluster throughout (no assignment heatmap): {', '.join(self.label(m) for m in others)}")
            notes += self.never_clustered(s)
            out.append({"scenario": s, "label": self.scenario_labels[s], "figures": [f for f in figs if f is not None],
                        "heatmaps": heatmaps,
                        "notes": notes})
        return out

    def communication(self) -> list[dict[str, Any]]:
        return [{"scenario": s, "label": self.scenario_labels[s], "figures": self.communication_figures(s)}
                for s in self.spec.scenarios]

    def intra_inter(self) -> list[dict[str, Any]]:
        out = []
        for s in self.spec.scenarios:
            if not self.has_groups(s):
                out.append({"scenario": s, "label": self.scenario_labels[s], "figure": None,
                            "note": "no ground-truth groups: intra/inter-cluster accuracy is undefined"})
                continue
            fig = self.intra_inter_figure(s)
            out.append({"scenario": s, "label": self.scenario_labels[s], "figure": fig,
                        "note": None if fig else "intra/inter-cluster accuracy was not recorded"})
        return out

    def sweeps(self) -> list[dict[str, Any]]:
        found = find_sweeps(self.summary, self.spec)
        return [{"sweep": sw, "figure": self.sweep_figure(sw)} for sw in found]


# --------------------------------------------------------------------------- sweeps


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
                    key = json.dumps([rest, spec.methods[method].training], sort_keys=True, default=str)
                    groups.setdefault(key, []).append((float(value), method))
                for members in groups.values():
                    if len({v for v, _ in members}) >= 2 and len({v for v, _ in members}) == len(members):
                        members.sort()
                        sweeps.append(Sweep(scenario, method_type, param, tuple(v for v, _ in members),
                                            tuple(m for _, m in members)))
    sweeps.sort(key=lambda sw: (sw.param != "beta",))  # stable: β sweeps first, then spec order
    return sweeps


# --------------------------------------------------------------------------- page


def _round_axis(rounds: list[int]) -> dict[str, Any]:
    """Integer round ticks: every round when there are few, plotly's choice (no fractions) otherwise."""
    axis: dict[str, Any] = {"title": "round"}
    if 0 < len(rounds) <= 12:
        axis.update(tickmode="array", tickvals=list(rounds))
    else:
        axis.update(tickformat="d")
    return axis


def _rows_height(rows: int) -> int:
    return int(min(900, max(300, 110 + 16 * rows)))


def _discrete_scale(k: int) -> list[list]:
    colors = [CLUSTER_COLORS[i % len(CLUSTER_COLORS)] for i in range(k)]
    if k == 1:
        return [[0.0, colors[0]], [1.0, colors[0]]]
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / k, c], [(i + 1) / k, c]]
    return scale


def _step_text(step) -> str:
    fields = step.model_dump(exclude={"kind"}, exclude_none=True)
    if not fields:
        return step.kind
    return f"{step.kind}(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"


def _local_text(t: Training) -> str:
    return f"{t.local_steps} steps" if t.local_steps is not None else f"{t.local_epochs:g} epochs"


def _kv_text(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or DASH


def _utc(stamp: str) -> str:
    """An ISO timestamp from timing.json as `YYYY-MM-DD HH:MM UTC`."""
    return stamp[:16].replace("T", " ") + " UTC"


def _hover(text: str) -> str:
    """`text` inside a plotly hovertemplate, where `%{...}` is template syntax."""
    return text.replace("{", "&#123;").replace("}", "&#125;")


def _hp_text(hyperparams: str) -> str:
    hp = json.loads(hyperparams) if hyperparams else {}
    return ", ".join(f"{k}={v}" for k, v in hp.items()) or DASH


def _environment():
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    return Environment(loader=PackageLoader("cflpipe.report", "templates"),
                       autoescape=select_autoescape(["html", "j2"]), undefined=StrictUndefined,
                       trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def plotly_bundle() -> str:
    """The plotly.js bundle shipped with the plotly package (no network)."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    if "</script" in js.lower():  # cannot happen with the official bundle; guard the inlining anyway
        js = re.sub(r"</(script)", r"<\\/\1", js, flags=re.IGNORECASE)
    return js


def render_report(spec: Spec, tables: dict[str, pd.DataFrame]) -> tuple[str, list[PaperTable]]:
    """The page's HTML and the paper tables, from the aggregate tables (no files written)."""
    import plotly

    report = Report(spec, tables)
    setup = report.setup()
    paper, details = report.comparison()
    context = {
        "setup": setup,
        "title": "cflpipe report", "description": spec.description or "", "version": __version__,
        "plotly_version": plotly.__version__, "sections": SECTIONS, "seeds": list(spec.seeds),
        "n_runs": len(report.runs), "accuracy": report.accuracy(),
        "paper_tables": paper, "details": details, "ranking": report.ranking(), "clients": report.clients(),
        "clustering": report.clustering(),
        "communication": report.communication(), "intra_inter": report.intra_inter(),
        "sweeps": report.sweeps(), "scenarios": report.overview(), "plot_config": json.dumps(PLOT_CONFIG, sort_keys=True),
        "alpha": f"{ALPHA:g}", "tie_mark": TIE_MARK,
        "reference_types": sorted({t for t in report.method_types.values() if is_reference(t)}), "results_dir": spec.results_dir,
        "spec_file": shown_spec_path(spec._source),
    }
    html = _environment().get_template("index.html.j2").render(plotly_js=plotly_bundle(), **context)
    return html, paper


def report_dir(spec: Spec) -> Path:
    return Path(spec.results_dir) / "report"


def shown_spec_path(source: str | None) -> str:
    """The spec's path as the report shows it: relative to the working directory when under it,
    normalised, so `./config/config.yaml` and `config/config.yaml` give the same report bytes."""
    if not source:
        return ""
    path = os.path.normpath(os.path.abspath(source))
    relative = os.path.relpath(path, os.path.abspath(os.getcwd()))
    return Path(path if relative.startswith("..") else relative).as_posix()


def build_report(spec: Spec) -> Path:
    """Write results/report/index.html and results/report/tables/summary.{csv,md,tex} from the
    aggregate outputs (run `cflpipe aggregate` first); returns the index.html path."""
    tables = read_aggregate(spec)
    if not len(tables["summary"]):
        raise CflpipeError(f"{aggregate_dir(spec) / 'summary.parquet'}: no runs to report")
    html, paper = render_report(spec, tables)
    out = report_dir(spec)
    write_tables(paper, out / "tables")
    store.write_text(out / "index.html", html)
    return out / "index.html"


__all__ = ["build_report", "render_report", "find_sweeps", "Sweep", "SECTIONS"]
