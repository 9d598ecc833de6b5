"""Plotly plumbing of the report's figures: the registry that turns each figure into JSON for the
page under a deterministic id, the page's plotly template, legends below the plots, trace colours,
and the conversions every figure needs (NaN to a gap, byte units, hover text, axes, heatmap
scales). The figures themselves are in report/figures.py."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

# Decimal units for byte axes: the largest that shows the figure's largest value as at least 1.
BYTE_UNITS = ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"))
# Colours of traces that are not methods (bytes down/up, a sweep's accuracy and ARI); every
# method has its own style (report/styles.py).
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd")
CLUSTER_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                  "#9c755f", "#bab0ac", "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")


@dataclass
class Figure:
    id: str
    json: str
    height: int
    title: str = ""


class Figures:
    """Collects plotly figures as JSON for the page; ids are sequential and deterministic."""

    def __init__(self):
        global _TEMPLATE
        if _TEMPLATE is None:  # built on first use: importing the report package must not load plotly
            _TEMPLATE = _template()
        self.count = 0

    def add(self, fig, name: str, height: int = 380, margin: dict | None = None) -> Figure:
        import plotly.io as pio

        self.count += 1
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        margin = {"l": 60, "r": 20, "t": 50, "b": 50, **(margin or {})}
        # Plotly's toolbar sits in the top-right corner: upright, in a right margin of its own,
        # and a long title wraps so that its lines end before it.
        title = fig.layout.title.text or ""
        lines = wrap_title(title)
        if len(lines) > 1:
            fig.update_layout(title_text="<br>".join(lines))
            margin["t"] += TITLE_LINE_PX * (len(lines) - 1)
            height += TITLE_LINE_PX * (len(lines) - 1)
        margin["r"] = max(margin["r"], MODEBAR_PX)
        fig.update_layout(template=_TEMPLATE, margin=margin, modebar=dict(orientation="v"))
        entries = [t.name or "" for t in fig.data if t.showlegend is not False and t.type not in ("heatmap",)]
        if entries and fig.layout.showlegend is not False:
            legend, extra = legend_below(entries)
            height += extra
            fig.update_layout(legend=legend, margin=dict(b=margin["b"] + extra))
        fig.update_layout(height=height)
        text = pio.to_json(fig, validate=False, pretty=False, remove_uids=True)
        # Inside <script type="application/json">: never let the text close the element.
        text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        return Figure(f"fig-{self.count:03d}-{slug}", text, height, title)


# Legends sit below the plot, never beside or inside it: with many methods a side legend gets
# taller than the plot and scrolls. Entries have one width (the longest name's), so the rows can
# be counted before the browser lays them out; the figure grows by the legend's height.
LEGEND_FONT_PX = 6.6   # mean advance of a 12 px system-ui character
LEGEND_SYMBOL_PX = 46  # the line-and-marker sample and its gap
LEGEND_ROW_PX = 21
# The narrowest plot area of a figure in the page's grid (520 px column less the margins).
LEGEND_WIDTH_PX = 430


# A 14 px title's mean character advance, the lines' spacing, the upright toolbar's width.
TITLE_FONT_PX = 7.7
TITLE_LINE_PX = 18
MODEBAR_PX = 36


def wrap_title(title: str) -> list[str]:
    """`title` in lines (at spaces) that fit the narrowest plot area; markup such as <br> is
    left alone (a title that has it is taken as already laid out)."""
    if not title or "<br" in title:
        return [title] if title else []
    width = int(LEGEND_WIDTH_PX / TITLE_FONT_PX)
    lines: list[str] = []
    for word in title.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


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
        # Ticks as plain numbers (0.116, 1000), never plotly's 1.16×10^-1 or SI suffixes (116m).
        xaxis=dict(gridcolor="#e5e5e5", linecolor="#999", zeroline=False, ticks="outside", automargin=True,
                   exponentformat="none"),
        yaxis=dict(gridcolor="#e5e5e5", linecolor="#999", zeroline=False, ticks="outside", automargin=True,
                   exponentformat="none"),
        legend=dict(bgcolor="rgba(255,255,255,0.7)")))


_TEMPLATE = None


def rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _finite(values) -> np.ndarray:
    return np.asarray(values, dtype="float64")


def clean(values) -> list:
    """Floats for JSON with NaN as null (plotly draws a gap)."""
    return [None if not math.isfinite(v) else float(v) for v in _finite(values)]


def byte_unit(largest: float) -> tuple[float, str]:
    """(scale, unit name) for an axis of byte counts whose largest value is `largest`."""
    for size, name in BYTE_UNITS:
        if math.isfinite(largest) and largest >= size:
            return 1 / size, name
    return 1.0, "B"


def round_axis(rounds: list[int]) -> dict[str, Any]:
    """Integer round ticks: every round when there are few, plotly's choice (no fractions) otherwise."""
    axis: dict[str, Any] = {"title": "round"}
    if 0 < len(rounds) <= 12:
        axis.update(tickmode="array", tickvals=list(rounds))
    else:
        axis.update(tickformat="d")
    return axis


def rows_height(rows: int) -> int:
    return int(min(900, max(300, 110 + 16 * rows)))


def discrete_scale(k: int) -> list[list]:
    colors = [CLUSTER_COLORS[i % len(CLUSTER_COLORS)] for i in range(k)]
    if k == 1:
        return [[0.0, colors[0]], [1.0, colors[0]]]
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / k, c], [(i + 1) / k, c]]
    return scale


def escape_hover(text: str) -> str:
    """`text` inside a plotly hovertemplate, where `%{...}` is template syntax."""
    return text.replace("{", "&#123;").replace("}", "&#125;")

