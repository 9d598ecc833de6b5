"""One visual style per method entry of a spec: colour × dash × marker, unique, grouped by family.

A method's style depends only on the spec (its method entries, their types and their order),
never on which methods a figure happens to plot, so a method looks the same in every figure of a
report and in every report of the same spec.

Families, in legend order: the reference (methods told the ground-truth groups, such as the
oracle: black and grey, dashed), baselines (FedAvg, FedProx, Local: blues), personalized methods
(greens), clustered methods (oranges and browns) and the methods of the seed papers (FedAC,
FCCA, FedTSDP, FeSEM and AWCFL/MCFL with their variants: reds and purples). A family owns a hue
range; inside it the n-th entry (in spec order) takes the n-th colour, and once the colours are
used up the next dash, and families never share a colour; markers cycle through `MARKERS` on top
of that. (colour, dash) is unique within a family of up to `len(colors) × len(dashes)` entries
(36 or more), (colour, dash, marker) up to 12 times that (`capacity`); consecutive entries
always differ in marker too.

A method type the report does not know (a plugin's) is placed by its declared capabilities:
told the groups → reference, clustered → clustered, personalized → personalized, else baseline.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    key: str
    title: str
    colors: tuple[str, ...]
    dashes: tuple[str, ...]


DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
MARKERS = ("circle", "square", "diamond", "triangle-up", "x", "cross", "triangle-down", "star", "pentagon",
           "hexagon", "triangle-left", "triangle-right")
FAMILIES = (
    Family("reference", "reference (told the true groups)", ("#000000", "#636363", "#969696"),
           ("dash", "dot", "dashdot", "longdash", "longdashdot", "solid")),
    Family("baseline", "baselines", ("#1f77b4", "#08306b", "#6baed6", "#17becf", "#4a6fa5", "#9ecae1"), DASHES),
    Family("personalized", "personalized", ("#2ca02c", "#005a32", "#7fbf3f", "#bcbd22", "#3b9a7e", "#a1d99b"),
           DASHES),
    Family("clustered", "clustered", ("#ff7f0e", "#8c564b", "#d9a400", "#b35806", "#c49c94", "#fdae6b"), DASHES),
    Family("seed", "seed papers", ("#d62728", "#9467bd", "#e377c2", "#7f0000", "#54278f", "#c51b7d", "#f768a1"),
           DASHES),
)
FAMILY = {f.key: f for f in FAMILIES}
FAMILY_TITLES = {f.key: f.title for f in FAMILIES}


@dataclass(frozen=True)
class Style:
    color: str
    dash: str
    marker: str
    family: str

    @property
    def key(self) -> tuple[str, str, str]:
        """What tells two methods apart (unique per spec up to `capacity`, see the module doc)."""
        return (self.color, self.dash, self.marker)


def method_family(method_type: str) -> str:
    """The report's family of a method type: its declared family (registry.FAMILIES), AWCFL's and
    MCFL's options on other methods drawn with the seed papers', Oracle's among the references."""
    from cflpipe.registry import all_methods

    info = all_methods().get(method_type)
    if info is None:
        return "baseline"
    if info.capabilities.needs_groups:
        return "reference"
    return "seed" if info.family == "modifier" else info.family


def style_at(family: Family, index: int) -> Style:
    """The `index`-th style of `family` (0-based)."""
    colors, dashes = len(family.colors), len(family.dashes)
    pairs = colors * dashes
    color = family.colors[index % colors]
    dash = family.dashes[(index // colors) % dashes]
    # (index mod pairs, index div pairs) ↔ index, and the marker adds the two: a bijection on
    # [0, pairs × len(MARKERS)), while consecutive entries already differ in marker.
    marker = MARKERS[(index % pairs + index // pairs) % len(MARKERS)]
    return Style(color, dash, marker, family.key)


def assign_styles(methods: list[tuple[str, str]]) -> dict[str, Style]:
    """{entry name: Style} for a spec's method entries given as (name, type) in spec order."""
    counts: dict[str, int] = {}
    styles = {}
    for name, method_type in methods:
        family = method_family(method_type)
        styles[name] = style_at(FAMILY[family], counts.get(family, 0))
        counts[family] = counts.get(family, 0) + 1
    return styles


def family_order(methods: list[str], styles: dict[str, Style]) -> list[str]:
    """`methods` grouped by family (FAMILIES' order), spec order inside a family: legend order."""
    rank = {f.key: i for i, f in enumerate(FAMILIES)}
    return sorted(methods, key=lambda m: rank[styles[m].family])  # stable


def capacity(family: str) -> int:
    """Entries of one family with distinct (colour, dash, marker): beyond that, styles repeat."""
    f = FAMILY[family]
    return len(f.colors) * len(f.dashes) * len(MARKERS)
