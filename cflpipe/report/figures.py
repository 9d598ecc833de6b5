"""The report's figures, each built from the aggregate view (report/view.py) in the style its
methods have for the whole report (report/styles.py), and added to the page's registry in the order
they are built (report/plotting.py): curves over rounds, heatmaps of labels, cluster assignments
and server similarity, communication and time, intra- vs inter-cluster accuracy, sweeps, per-client
accuracy, the critical-difference diagram and the key of method styles."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from cflpipe import store
from cflpipe.report.plotting import (COLORS, LEGEND_FONT_PX, Figure, Figures, byte_unit, clean, discrete_scale,
                                     escape_hover, rgba, round_axis, rows_height)
from cflpipe.report.ranks import Ranking
from cflpipe.report.styles import FAMILY_TITLES
from cflpipe.report.view import RANK_FIGURE_TITLE, AggregateView, Sweep

# Per-client box plots draw every client as a point up to this many clients, outliers only beyond.
MAX_BOX_POINTS = 200

# Round figures that only some methods record (rounds.parquet), plotted in the clustering section
# for the methods that have them: title, y-axis title, y-axis settings.
METHOD_CURVES: dict[str, tuple[str, str, dict | None]] = {
    "hopkins": ("Hopkins statistic of the clients' public outputs (FedTSDP clusters above h_th)", "H",
                dict(range=[0, 1.02])),
    "clustering_ran": ("share of seeds whose server clustered in the round (FedTSDP)", "share",
                       dict(range=[-0.02, 1.02])),
    "shared_layers": ("number of shared layers (FedTSDP; the rest are personalization layers)", "layers",
                      dict(rangemode="tozero")),
    "fedac_clusters": ("FedAC, LCFed: number of cluster models", "clusters", dict(rangemode="tozero")),
    "icfl_clusters": ("ICFL: number of clusters (the pool included while it has members)", "clusters",
                      dict(rangemode="tozero")),
    "icfl_alpha_t": ("ICFL: split bar α_t (a cluster whose updates' cohesion is below it is bisected)", "α_t",
                     dict(range=[0, 1.02])),
    "flow_nll": ("FCCA: cINN training loss (Eq. 3, mean over the round's clients)", "NLL", None),
}



# Fractions (accuracies, F1, NMI) lie in [0, 1], ARI in [-1, 1], counts, bytes and losses above 0:
# a ± std band is clipped to its figure's range (a cluster count's band dipped below 0). A
# method's own figures (FCCA's flow NLL is negative) are left unclipped.
_FRACTIONS = ("acc", "f1", "nmi", "ami", "intra_acc", "inter_acc", "global_acc", "best_acc", "best_test_acc",
              "best_val_acc", "val_acc")
_NON_NEGATIVE = ("n_clusters", "loss", "train_loss", "bytes", "models", "global_models", "global_rows", "sampled", "skipped")


def figure_range(figure: str) -> tuple[float, float]:
    if figure == "ari":
        return -1.0, 1.0
    if figure.startswith(_FRACTIONS):
        return 0.0, 1.0
    if figure.startswith(_NON_NEGATIVE):
        return 0.0, math.inf
    return -math.inf, math.inf


# A point of a scatter is labelled only this far (a fraction of the axis range) from every point
# labelled before it; the others are told apart by the legend (labels of close points overlapped).
LABEL_APART = 0.06


def label_apart(points: dict[str, tuple[float, float]], distance: float) -> dict[str, list[str]]:
    """The points to label, greedily from the highest, each at least `distance` from those kept,
    with the names each label stands for: a point closer than that to a labelled one is named in
    its label (points that coincide are labelled together, not under one name)."""
    kept: dict[str, list[str]] = {}
    for name, (x, y) in sorted(points.items(), key=lambda item: -item[1][1]):
        near = [k for k in kept if math.hypot(x - points[k][0], y - points[k][1]) < distance]
        if near:
            kept[min(near, key=lambda k: math.hypot(x - points[k][0], y - points[k][1]))].append(name)
        else:
            kept[name] = [name]
    return kept


def together_text(names: list[str], per_line: int = 3) -> str:
    """Names of one label, `per_line` to a line (plotly's <br>)."""
    return "<br>".join(", ".join(names[i:i + per_line]) for i in range(0, len(names), per_line))


class FigureBuilder:
    """Builds the figures of one report from its view, numbered in the order they are built."""

    def __init__(self, view: AggregateView):
        self.view = view
        self.registry = Figures()

    def curve_figure(self, scenario: str, figure: str, title: str, ytitle: str, scale: float = 1.0,
                     methods: list[str] | None = None, eval_only: bool = True, band: bool = True,
                     height: int = 380, yaxis: dict | None = None, marks: list[int] = ()) -> Figure | None:
        import plotly.graph_objects as go

        view = self.view
        fig = go.Figure()
        for m in view.plot_order(methods if methods is not None else view.methods_on(scenario)):
            rows = view.curve(scenario, m, figure, eval_only)
            if rows is None:
                continue
            x = rows["round"].astype(int).tolist()
            mean = rows[f"{figure}_mean"].to_numpy(dtype=float) * scale
            std = rows[f"{figure}_std"].to_numpy(dtype=float) * scale
            style, name = view.styles[m], view.label(m)
            if band and len(x) > 0 and np.any(np.nan_to_num(std) > 0):
                spread = np.nan_to_num(std)
                low, high = figure_range(figure)
                fig.add_trace(go.Scatter(x=x + x[::-1],
                                         y=clean(np.clip(np.concatenate([mean + spread, (mean - spread)[::-1]]),
                                                         low * scale, high * scale)),
                                         fill="toself", fillcolor=rgba(style.color, 0.15), line=dict(width=0),
                                         mode="lines", hoverinfo="skip", showlegend=False, legendgroup=m,
                                         name=f"{name} ± std"))
            # Markers on every point of short curves, every few points of long ones: a method is
            # told apart by colour, dash and marker (styles.py).
            every = max(1, len(x) // 20)
            # A sampled evaluation's point (training.eval_clients) is an estimate from fewer clients.
            sampled = [""] * len(x)
            if "evaluated_clients_mean" in rows.columns:
                everyone = view.spec.scenarios[scenario].participants  # new clients are not evaluated
                sampled = [f" (a sample of {n:.0f} of {everyone} clients)" if np.isfinite(n) and n < everyone else ""
                           for n in rows["evaluated_clients_mean"].to_numpy(dtype=float)]
            fig.add_trace(go.Scatter(x=x, y=clean(mean), mode="lines+markers", name=name, legendgroup=m,
                                     line=dict(color=style.color, width=2, dash=style.dash),
                                     marker=dict(size=7, symbol=style.marker, color=style.color,
                                                 maxdisplayed=0 if every == 1 else math.ceil(len(x) / every)),
                                     customdata=clean(std), text=sampled if any(sampled) else None,
                                     # one seed: no std to show (a null would print as NaN)
                                     hovertemplate=f"{escape_hover(name)}<br>round %{{x}}{'%{text}' if any(sampled) else ''}<br>%{{y:.4g}}"
                                                   + (" ± %{customdata:.3g}" if np.isfinite(std).any() else "")
                                                   + "<extra></extra>"))
        if not fig.data:
            return None
        for r in marks:  # a move (scenario drift) happens between the evaluations of rounds r − 1 and r
            fig.add_vline(x=r - 0.5, line=dict(color="#888", dash="dot", width=1), annotation_text="moved",
                          annotation_position="top")
        fig.update_layout(title=title, showlegend=True,
                          xaxis=round_axis(sorted({x for t in fig.data for x in t.x})),
                          yaxis={"title": ytitle, **(yaxis or {})})
        return self.registry.add(fig, f"{scenario}-{figure}", height)

    def label_heatmap(self, scenario: str) -> Figure | None:
        import plotly.graph_objects as go

        view = self.view
        stats = view.stats[scenario]
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
                                   customdata=counts, colorbar=dict(title=dict(text="share", side="right"), tickformat=".0%"),
                                   hovertemplate="client %{y}<br>label %{x}<br>%{customdata:.0f} samples "
                                                 "(%{z:.0%})<extra></extra>"))
        shapes = self._group_lines(stats["group"].to_numpy(), len(labels)) if grouped else []
        fig.update_layout(title=f"{view.scenario_labels[scenario]}: label share of each client's samples (sorted by group)",
                          xaxis=dict(title="label", type="category"),
                          yaxis=dict(title="client", autorange="reversed", type="category"), shapes=shapes)
        return self.registry.add(fig, f"{scenario}-labels", rows_height(len(stats)))

    @staticmethod
    def _group_lines(groups: np.ndarray, width: int) -> list[dict]:
        edges = np.nonzero(np.diff(groups))[0]
        return [dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=e + 0.5, y1=e + 0.5,
                     line=dict(color="#d62728", width=1.5)) for e in edges]

    def assignment_heatmap(self, scenario: str, method: str) -> tuple[Figure | None, str | None]:
        import plotly.graph_objects as go

        view = self.view
        matrix = set(view.spec.matrix())
        seed = next((k for k in view.spec.seeds if (scenario, method, k) in matrix), None)
        if seed is None:
            return None, None
        path = view.spec.run_dir(scenario, method, seed) / "clusters.parquet"
        if not path.is_file():
            return None, f"{view.label(method)}: {path} is missing, so there is no assignment heatmap"
        clusters = store.read_parquet(path)
        if not len(clusters):
            return None, f"{view.label(method)}: no clustering checkpoint in {path}"
        table = clusters.pivot(index="client", columns="round", values="cluster")
        # the groups as they ended (scenario drift moves clients; otherwise every round's are alike)
        groups = clusters.drop_duplicates("client", keep="last").set_index("client")["true_group"]
        order = sorted(table.index, key=lambda c: (int(groups.get(c, -1)), int(c)))
        table = table.loc[order]
        grouped = bool((groups >= 0).any())
        names = [f"c{int(c)} · g{int(groups[c])}" if grouped else f"c{int(c)}" for c in order]
        z = table.to_numpy(dtype=float)
        k = int(np.nanmax(z)) + 1 if np.isfinite(z).any() else 1
        fig = go.Figure(go.Heatmap(
            z=z, x=[str(r) for r in table.columns], y=names, colorscale=discrete_scale(k), zmin=-0.5,
            zmax=k - 0.5, colorbar=dict(title=dict(text="cluster", side="right"), tickvals=list(range(k)) if k <= 16 else None),
            xgap=1, hovertemplate="client %{y}<br>round %{x}<br>cluster %{z}<extra></extra>"))
        shapes = self._group_lines(np.array([int(groups[c]) for c in order]), len(table.columns)) if grouped else []
        fig.update_layout(title=f"{view.scenario_labels[scenario]} · {view.label(method)} (seed {seed}): client clusters per round",
                          xaxis=dict(title="round", type="category"),
                          yaxis=dict(title="client" + (" (sorted by true group)" if grouped else ""),
                                     autorange="reversed", type="category"), shapes=shapes)
        return self.registry.add(fig, f"{scenario}-{method}-assignment", rows_height(len(order))), None

    def similarity_heatmap(self, scenario: str, method: str) -> Figure | None:
        """The server's client-similarity matrix at the last evaluation round (FCCA's D, the
        paper's Fig. 2) of the first seed, clients sorted by true group, for methods that write
        similarity.parquet."""
        import plotly.graph_objects as go

        view = self.view
        matrix = set(view.spec.matrix())
        seed = next((k for k in view.spec.seeds if (scenario, method, k) in matrix), None)
        run_dir = view.spec.run_dir(scenario, method, seed) if seed is not None else None
        if run_dir is None or not (run_dir / "similarity.parquet").is_file():
            return None
        table = store.read_parquet(run_dir / "similarity.parquet")
        if not len(table):
            return None
        last = int(table["round"].max())
        square = table[table["round"] == last].pivot(index="client", columns="other", values="value")
        groups = pd.Series(-1, index=square.index)
        if (run_dir / "clusters.parquet").is_file():
            known = store.read_parquet(run_dir / "clusters.parquet").drop_duplicates("client", keep="last")
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
        fig.update_layout(title=f"{view.scenario_labels[scenario]} · {view.label(method)} (seed {seed}): server similarity D at round {last}"
                                + (" (sorted by true group)" if grouped else ""),
                          xaxis=dict(type="category", showticklabels=len(order) <= 40),
                          yaxis=dict(type="category", autorange="reversed", showticklabels=len(order) <= 40),
                          shapes=shapes)
        return self.registry.add(fig, f"{scenario}-{method}-similarity", max(420, rows_height(len(order))))

    def communication_figures(self, scenario: str) -> list[Figure]:
        import plotly.graph_objects as go

        view = self.view
        # Axes start at 0 in a unit that fits the largest value: methods that send the same model
        # differ by a few bytes of bookkeeping at most, which must not fill the plot's height.
        scale, unit = byte_unit(max(view.largest(scenario, "bytes_down"), view.largest(scenario, "bytes_up")))
        figs = [self.accuracy_bytes_figure(scenario),
                self.curve_figure(scenario, "bytes_down", f"{view.scenario_labels[scenario]}: bytes down per round (server → clients)",
                                  unit, scale, eval_only=False, band=False, height=330, yaxis=dict(rangemode="tozero")),
                self.curve_figure(scenario, "bytes_up", f"{view.scenario_labels[scenario]}: bytes up per round (clients → server)",
                                  unit, scale, eval_only=False, band=False, height=330, yaxis=dict(rangemode="tozero"))]
        methods = view.methods_on(scenario)
        names = [view.label(m) for m in methods]
        rows = [view.summary_row(scenario, m) for m in methods]
        scale, unit = byte_unit(max([float(r[f"bytes_{d}_total_mean"]) for r in rows for d in ("down", "up")
                                     if math.isfinite(float(r[f"bytes_{d}_total_mean"]))] + [0.0]))
        fig = go.Figure()
        for direction, colour in (("down", "#4e79a7"), ("up", "#f28e2b")):
            fig.add_trace(go.Bar(x=names, y=clean([r[f"bytes_{direction}_total_mean"] * scale for r in rows]),
                                 name=direction, marker_color=colour,
                                 error_y=dict(type="data", array=clean([r[f"bytes_{direction}_total_std"] * scale
                                                                        for r in rows]))))
        fig.update_layout(title=f"{view.scenario_labels[scenario]}: total bytes over all rounds", yaxis_title=unit,
                          yaxis_rangemode="tozero", barmode="group")
        figs.append(self.registry.add(fig, f"{scenario}-bytes-total", 330))
        fig = go.Figure(go.Bar(x=names, y=clean([r["seconds_per_round_mean"] for r in rows]),
                               marker_color=[view.color[m] for m in methods],
                               error_y=dict(type="data", array=clean([r["seconds_per_round_std"] for r in rows])),
                               hovertemplate="%{x}: %{y:.3g} s/round<extra></extra>"))
        devices = sorted(set(view.timing.loc[view.timing["scenario"] == scenario, "device"].astype(str)) - {""})
        fig.update_layout(title=f"{view.scenario_labels[scenario]}: wall-clock time per round" + (f" ({', '.join(devices)})" if devices
                                                                             else ""),
                          yaxis_title="seconds / round")
        figs.append(self.registry.add(fig, f"{scenario}-seconds", 330))
        return [f for f in figs if f is not None]

    def intra_inter_figure(self, scenario: str) -> Figure | None:
        import plotly.graph_objects as go

        view = self.view
        fig = go.Figure()
        points = {}
        for m in view.plot_order(view.methods_on(scenario)):
            r = view.summary_row(scenario, m)
            x, y = r["inter_acc_mean"] * 100, r["intra_acc_mean"] * 100
            if math.isfinite(x) and math.isfinite(y):
                points[m] = (x, y, r)
        lo = min([100.0, *(min(x, y) for x, y, _ in points.values())])
        hi = max([0.0, *(max(x, y) for x, y, _ in points.values())])
        labelled = label_apart({m: (x, y) for m, (x, y, _) in points.items()}, max(hi - lo, 1.0) * LABEL_APART)
        for m, (x, y, r) in points.items():
            style, name = view.styles[m], view.label(m)
            text = together_text([view.label(n) for n in labelled[m]]) if m in labelled else name
            fig.add_trace(go.Scatter(
                x=[x], y=[y], mode="markers+text" if m in labelled else "markers", text=[text],
                textposition="top center", name=name,
                marker=dict(size=11, color=style.color, symbol=style.marker),
                error_x=dict(type="data", array=clean([r["inter_acc_std"] * 100]), color=style.color),
                error_y=dict(type="data", array=clean([r["intra_acc_std"] * 100]), color=style.color),
                hovertemplate=f"{escape_hover(name)}<br>inter %{{x:.2f}}%<br>intra %{{y:.2f}}%<extra></extra>"))
        if not fig.data:
            return None
        pad = max(2.0, 0.1 * (hi - lo))
        lo, hi = max(0.0, lo - pad), min(100.0, hi + pad)
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#999", dash="dot"),
                                 name="intra = inter", hoverinfo="skip"))
        fig.update_layout(title=f"{view.scenario_labels[scenario]}: accuracy on the own group's data (intra) vs the other groups' (inter)",
                          xaxis=dict(title="inter-cluster accuracy %", range=[lo, hi]),
                          yaxis=dict(title="intra-cluster accuracy %", range=[lo, hi]))
        return self.registry.add(fig, f"{scenario}-intra-inter", 420)

    def sweep_figure(self, sweep: Sweep) -> Figure:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        view = self.view
        rows = [view.summary_row(sweep.scenario, m) for m in sweep.methods]
        acc = [r["acc_macro_mean"] * 100 for r in rows]
        ari = [r["ari_mean"] for r in rows]
        clustered = view.clustered_methods(sweep.scenario)
        has_ari = any(math.isfinite(v) for v in ari) and any(m in clustered for m in sweep.methods)
        fig = make_subplots(specs=[[{"secondary_y": has_ari}]])
        hover = [view.label(m) for m in sweep.methods]
        fig.add_trace(go.Scatter(x=sweep.values, y=clean(acc), mode="lines+markers", name="acc macro %",
                                 text=hover, line=dict(color=COLORS[0]),
                                 error_y=dict(type="data", array=clean([r["acc_macro_std"] * 100 for r in rows])),
                                 hovertemplate="%{text}: %{y:.2f}%<extra></extra>"), secondary_y=False)
        if has_ari:
            fig.add_trace(go.Scatter(x=sweep.values, y=clean(ari), mode="lines+markers", name="ARI", text=hover,
                                     line=dict(color=COLORS[1], dash="dash"),
                                     error_y=dict(type="data", array=clean([r["ari_std"] for r in rows])),
                                     hovertemplate="%{text}: ARI %{y:.3f}<extra></extra>"), secondary_y=True)
            low = min([0.0] + [v for v in ari if math.isfinite(v)])
            fig.update_yaxes(title_text="ARI", secondary_y=True, showgrid=False, range=[low - 0.05, 1.05],
                             tickmode="linear", tick0=0, dtick=0.25)
        positive = all(v > 0 for v in sweep.values)
        log = positive and max(sweep.values) / min(sweep.values) >= 100
        fig.update_xaxes(title_text=sweep.symbol, type="log" if log else "linear")
        fig.update_yaxes(title_text="personalized accuracy %", secondary_y=False)
        fig.update_layout(title=f"{view.scenario_labels[sweep.scenario]}: {sweep.method_type} vs {sweep.symbol}")
        return self.registry.add(fig, f"{sweep.scenario}-{sweep.method_type}-{sweep.param}-sweep", 360)

    def tuning_figure(self, scenario: str) -> Figure | None:
        """Each tuned method's tuning curve on a scenario: mean validation accuracy over the tuning
        seeds of every trial (± std), the chosen trial ringed. Against the value when the space is
        one numeric key, else against the trials in their order."""
        import plotly.graph_objects as go

        view = self.view
        chosen = {m: c for (s, m), c in view.tuning.items() if s == scenario}
        if not chosen:
            return None
        keys = {key for c in chosen.values() for t in c["trials"] for key in t["values"]}
        numeric = len(keys) == 1 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                         for c in chosen.values() for t in c["trials"] for v in t["values"].values())
        fig = go.Figure()
        for m in view.plot_order(list(chosen)):
            trials = chosen[m]["trials"]
            x = [next(iter(t["values"].values())) if numeric else ", ".join(f"{k}={v}" for k, v in t["values"].items())
                 for t in trials]
            y = [None if t["score"] is None else t["score"] * 100 for t in trials]
            std = [0 if t["std"] is None else t["std"] * 100 for t in trials]
            style, name = view.styles[m], view.label(m)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=name, legendgroup=m,
                                     line=dict(color=style.color, width=2, dash=style.dash),
                                     marker=dict(size=7, symbol=style.marker, color=style.color),
                                     error_y=dict(type="data", array=std, thickness=1),
                                     hovertemplate=f"{name}: %{{x}}: %{{y:.2f}}%<extra></extra>"))
            best = next(i for i, t in enumerate(trials) if t["trial"] == chosen[m]["chosen"])
            fig.add_trace(go.Scatter(x=[x[best]], y=[y[best]], mode="markers", legendgroup=m, showlegend=False,
                                     marker=dict(size=15, symbol="circle-open", color=style.color, line=dict(width=2)),
                                     hovertemplate=f"{name}: chosen %{{x}}<extra></extra>"))
        values = [x for c in chosen.values() for t in c["trials"] for x in t["values"].values()] if numeric else []
        log = numeric and min(values) > 0 and max(values) / min(values) >= 10
        fig.update_xaxes(title_text=next(iter(keys)) if numeric else "trial", type="log" if log else None)
        fig.update_yaxes(title_text="validation accuracy % (macro)")
        fig.update_layout(title=f"{view.scenario_labels[scenario]}: tuning (mean over tuning seeds ± std; "
                                f"ringed: chosen)")
        return self.registry.add(fig, f"{scenario}-tuning", 420)

    def loss_figure(self, scenario: str) -> Figure | None:
        """Training loss per round; on a log axis when it spans a decade or more (then without
        bands: mean − std is often below 0 there)."""
        view = self.view
        values = []
        for m in view.methods_on(scenario):
            rows = view.curve(scenario, m, "train_loss", eval_only=False)
            if rows is not None:
                values += [v for v in rows["train_loss_mean"].to_numpy(dtype=float) if math.isfinite(v)]
        if not values:
            return None
        log = min(values) > 0 and max(values) / min(values) >= 10
        return self.curve_figure(scenario, "train_loss", f"{view.scenario_labels[scenario]}: training loss (mean over seeds"
                                 + (")" if log else " ± std)"),
                                 "training loss" + (" (log scale)" if log else ""), eval_only=False, band=not log,
                                 yaxis=dict(type="log", dtick=1) if log else dict(rangemode="tozero"))

    def accuracy_bytes_figure(self, scenario: str) -> Figure | None:
        """Personalized accuracy at each evaluated round against the bytes sent (up + down) up to it."""
        import plotly.graph_objects as go

        view = self.view
        series = [(m, rows) for m in view.plot_order(view.methods_on(scenario))
                  if (rows := view.curve(scenario, m, "acc_macro")) is not None and "bytes_cumulative_mean" in rows.columns]
        if not series:
            return None
        scale, unit = byte_unit(max(float(np.nanmax(rows["bytes_cumulative_mean"].to_numpy(dtype=float)))
                                    for _, rows in series))
        fig = go.Figure()
        for m, rows in series:
            style, name = view.styles[m], view.label(m)
            fig.add_trace(go.Scatter(
                x=clean(rows["bytes_cumulative_mean"].to_numpy(dtype=float) * scale),
                y=clean(rows["acc_macro_mean"].to_numpy(dtype=float) * 100), mode="lines+markers", name=name,
                legendgroup=m, line=dict(color=style.color, width=2, dash=style.dash),
                marker=dict(size=7, symbol=style.marker, color=style.color), cliponaxis=False,  # Local's 0 bytes
                customdata=rows["round"].astype(int).tolist(),
                hovertemplate=f"{escape_hover(name)}<br>round %{{customdata}}<br>%{{x:.4g}} {unit} sent<br>%{{y:.2f}}%"
                              "<extra></extra>"))
        fig.update_layout(title=f"{view.scenario_labels[scenario]}: personalized accuracy vs bytes sent so far (mean over seeds)",
                          showlegend=True, xaxis=dict(title=f"{unit} sent up to the round (down + up)", rangemode="tozero"),
                          yaxis=dict(title="accuracy %"))
        return self.registry.add(fig, f"{scenario}-accuracy-bytes")

    def client_accuracy_figure(self, scenario: str) -> Figure | None:
        """One horizontal box per method of its clients' final accuracy; the box's dashed line is
        the mean over clients, i.e. acc macro (mean over seeds)."""
        import plotly.graph_objects as go

        view = self.view
        fig = go.Figure()
        for m in view.plot_order(view.methods_on(scenario)):
            values = view.client_accuracy(scenario, m)
            if not len(values):
                continue
            style, name = view.styles[m], view.label(m)
            fig.add_trace(go.Box(
                x=values.to_numpy(dtype=float).tolist(), y=[name] * len(values), name=name, orientation="h",
                boxmean=True, boxpoints="all" if len(values) <= MAX_BOX_POINTS else "outliers", jitter=0.6,
                pointpos=0, line=dict(color=style.color, width=1.5), fillcolor=rgba(style.color, 0.12),
                marker=dict(color=style.color, symbol=style.marker, size=5, opacity=0.75),
                text=[f"client {int(c)}" for c in values.index], hoveron="boxes+points",
                hoverinfo="x+text", showlegend=False))
        if not fig.data:
            return None
        fig.update_layout(title=f"{view.scenario_labels[scenario]}: final accuracy of each client (its mean over seeds)",
                          showlegend=False, xaxis=dict(title="client accuracy %"),
                          yaxis=dict(type="category", autorange="reversed", title=None))
        return self.registry.add(fig, f"{scenario}-client-accuracy", 110 + 30 * len(fig.data))

    def cd_diagram(self, ranking: Ranking) -> Figure:
        """Demšar's critical-difference diagram: the rank axis (1 = best, left), each method's
        average rank joined to its label (the better half on the left, the worse on the right),
        and a thick bar under every group of methods that do not differ significantly."""
        import plotly.graph_objects as go

        view = self.view
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
            style, name = view.styles[m], view.label(m)
            fig.add_trace(go.Scatter(x=[rank, rank, edge], y=[0, y, y], mode="lines+markers", name=name,
                                     showlegend=False, line=dict(color=style.color, dash=style.dash, width=1.5),
                                     marker=dict(symbol=style.marker, color=style.color, size=[10, 0, 0]),
                                     hovertemplate=f"{escape_hover(name)}: average rank {rank:.2f}<extra></extra>"))
            annotations.append(dict(x=edge, y=y, text=f"{name} ({rank:.2f})" if side == "left" else f"({rank:.2f}) {name}",
                                    showarrow=False, xanchor="right" if side == "left" else "left",
                                    xshift=-4 if side == "left" else 4))
        bottom = top_row - step * (half - 1) - 0.3
        label = int(16 + LEGEND_FONT_PX * max(len(view.label(m)) + 7 for m in names))
        fig.update_layout(title=f"Average rank by {RANK_FIGURE_TITLE} over {len(ranking.scenarios)} scenarios "
                                f"(Nemenyi, α = {ranking.alpha:g}; bars join methods that do not differ)",
                          showlegend=False, shapes=shapes, annotations=annotations,
                          xaxis=dict(visible=False, range=[lo - pad, hi + pad], fixedrange=True),
                          yaxis=dict(visible=False, range=[bottom, 1.2], fixedrange=True))
        height = int(70 + 60 * (1.2 - bottom))
        return self.registry.add(fig, "ranking-cd", height, margin=dict(l=label, r=label, t=50, b=10))

    def style_key(self) -> Figure:
        """Every method entry with its line, dash and marker, grouped by family: the key to every figure."""
        import plotly.graph_objects as go

        view = self.view
        fig = go.Figure()
        order = view.plot_order(view.methods)
        for m in order:
            style, name = view.styles[m], view.label(m)
            fig.add_trace(go.Scatter(x=[0, 1, 2], y=[name] * 3, mode="lines+markers", name=name, showlegend=False,
                                     line=dict(color=style.color, dash=style.dash, width=2.5),
                                     marker=dict(symbol=style.marker, size=9, color=style.color),
                                     hovertemplate=f"{escape_hover(name)} ({escape_hover(view.method_types[m])}): "
                                                   f"{FAMILY_TITLES[style.family]}<extra></extra>"))
        families = []
        for m in order:
            title = FAMILY_TITLES[view.styles[m].family]
            if not families or families[-1][0] != title:
                families.append((title, view.label(m)))
        annotations = [dict(x=2.15, y=first, xref="x", yref="y", text=title, showarrow=False, xanchor="left",
                            font=dict(color="#666")) for title, first in families]
        fig.update_layout(title="Method styles (the same in every figure), grouped by family", showlegend=False,
                          xaxis=dict(visible=False, range=[-0.15, 3.4]),
                          yaxis=dict(type="category", autorange="reversed", showgrid=False, ticks=""),
                          annotations=annotations)
        # The title and margins take about 110 px whatever the count; below about 22 px a row
        # plotly drops category labels that would touch (3 methods lost one, and the family
        # names overlapped).
        return self.registry.add(fig, "method-styles", 110 + 24 * len(order))

    def method_figures(self, scenario: str) -> list[Figure]:
        """Per-round figures a method records of its own (rounds.parquet columns), every round."""
        view = self.view
        figs = []
        for figure, (title, ytitle, yaxis) in METHOD_CURVES.items():
            methods = [m for m in view.methods_on(scenario) if view.curve(scenario, m, figure, eval_only=True) is not None]
            if methods:
                figs.append(self.curve_figure(scenario, figure, f"{view.scenario_labels[scenario]}: {title}", ytitle, methods=methods,
                                              eval_only=False, yaxis=yaxis))
        return [f for f in figs if f is not None]


# The map's ARI colours: red (no recovery) through yellow to green (the true groups); below 0
# (worse than chance) drawn as 0.
ARI_SCALE = [[0.0, "#d73027"], [0.5, "#fee08b"], [1.0, "#1a9850"]]


def robustness_heatmaps(registry: Figures, rmap, labels: dict[str, str]) -> list[Figure]:
    """One figure per method family of the robustness map (report/robustness.py): ARI per cell
    on the left, personalized accuracy on the right, the references' rows on top of each; a
    marked cell is one whose clustering came to none in some seed."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from cflpipe.report.robustness import cell_text

    columns = [rmap.column_label(s, "<br>") for s in rmap.scenarios]
    figures = []
    for family, methods in rmap.families.items():
        rows = list(dict.fromkeys([*rmap.references, *methods]))
        names = [labels.get(m, m) for m in rows]
        ari = rmap.ari.loc[rows, rmap.scenarios].to_numpy(dtype=float)
        acc = rmap.acc.loc[rows, rmap.scenarios].to_numpy(dtype=float)
        marked = rmap.degenerate.loc[rows, rmap.scenarios].to_numpy(dtype=float)
        seeds = rmap.seeds.loc[rows, rmap.scenarios].to_numpy(dtype=float)
        ari_text = [[cell_text(a, d) for a, d in zip(ra, rd)] for ra, rd in zip(ari, marked)]
        acc_text = [[cell_text(a, 0, 0, 100) for a in ra] for ra in acc]
        hover = [[f"{names[i]}<br>{rmap.column_label(s)}<br>ARI {cell_text(ari[i, j], marked[i, j])}, accuracy "
                  f"{cell_text(acc[i, j], 0, 1, 100)} %<br>{int(seeds[i, j]) if math.isfinite(seeds[i, j]) else 0} "
                  f"seed(s)" + (f", {int(marked[i, j])} without a clustering" if marked[i, j] > 0 else "")
                  for j, s in enumerate(rmap.scenarios)] for i in range(len(rows))]
        # Stacked, each the page's full width: a map has a column per cell (24 in the map spec).
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                            subplot_titles=("ARI of the final clustering", "personalized accuracy (%)"))
        fig.add_trace(go.Heatmap(z=np.clip(ari, 0, 1), x=columns, y=names, text=ari_text, texttemplate="%{text}",
                                 customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                                 colorscale=ARI_SCALE, zmin=0, zmax=1, xgap=1, ygap=1, showscale=False), 1, 1)
        fig.add_trace(go.Heatmap(z=acc * 100, x=columns, y=names, text=acc_text, texttemplate="%{text}",
                                 customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                                 colorscale="Blues", zmin=0, zmax=100, xgap=1, ygap=1, showscale=False), 2, 1)
        fig.update_yaxes(autorange="reversed", type="category")
        fig.update_xaxes(type="category", tickangle=0, tickfont=dict(size=9))
        fig.update_xaxes(showticklabels=False, row=1, col=1)  # the cells are named once, under both maps
        axes = ", ".join(rmap.varying)
        fig.update_layout(title=f"Robustness map: {family} (columns: {axes}; references on top; mean over seeds)")
        ticks = 14 * max(len(rmap.varying), 1)
        height = 170 + 2 * 22 * len(rows) + ticks
        figures.append(registry.add(fig, f"robustness-{family}", height, margin=dict(l=110, b=30 + ticks)))
    return figures
