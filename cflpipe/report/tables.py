"""Paper-style tables from `summary.parquet`: rows = methods, columns = scenarios, cells
"mean ± std" over seeds, the best cell of each scenario column in bold.

Tables: personalized accuracy (`acc_macro`, in %), or the figures a spec lists under
`report.tables` with its own titles (e.g. FCCA's "global" and "personalized" accuracy), then ARI
(only the scenarios with ground-truth groups and, in the report, only the methods that cluster
clients; omitted when empty). Written as `summary.csv` (one block per table,
`table` column first), `summary.md` (GitHub Markdown, `**bold**`) and `summary.tex` (booktabs,
`\\textbf{}`; needs `\\usepackage{booktabs}`).

Bold marks every cell whose mean, as printed, equals the column's best printed mean (ties are
all bold). Reference methods (those whose declared capabilities say they are told the true
groups, such as the oracle) are shown but never marked best. A method that
does not run on a scenario, or a figure that is undefined there, prints as "—" ("--" in LaTeX).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cflpipe import store



def is_reference(method_type: str) -> bool:
    """A method told the ground-truth groups (capability needs_groups): a reference, never "best"."""
    from cflpipe.methods import METHODS, all_methods

    info = METHODS.get(method_type) or all_methods().get(method_type)
    return bool(info and info.capabilities.needs_groups)

DASH = "—"


@dataclass(frozen=True)
class TableSpec:
    key: str            # short name: file block / html id
    title: str
    figure: str         # summary.parquet figure (`<figure>_mean`, `<figure>_std`)
    scale: float        # multiply mean and std (100 for %)
    digits: int
    higher_is_better: bool = True


ACCURACY = TableSpec("accuracy", "Personalized accuracy (%), mean ± std over seeds", "acc_macro", 100.0, 1)
ARI = TableSpec("ari", "Adjusted Rand index of the clustering vs the ground-truth groups, mean ± std over seeds",
                "ari", 1.0, 2)
PAPER_TABLES = (ACCURACY, ARI)
# Figures a spec's report.tables may list where the smallest value is the best (traffic).
LOWER_IS_BETTER = ("bytes_down_total", "bytes_up_total", "bytes_total")


@dataclass
class Cell:
    mean: float
    std: float
    text: str
    bold: bool = False

    @property
    def missing(self) -> bool:
        return not math.isfinite(self.mean)


@dataclass
class PaperTable:
    spec: TableSpec
    scenarios: list[str]
    methods: list[str]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)  # (method, scenario)
    reference: list[str] = field(default_factory=list)  # methods never marked best

    @property
    def title(self) -> str:
        return self.spec.title

    def cell(self, method: str, scenario: str) -> Cell:
        return self.cells[(method, scenario)]

    def best(self, scenario: str) -> list[str]:
        return [m for m in self.methods if self.cells[(m, scenario)].bold]


def format_mean_std(mean: float, std: float, digits: int, pm: str = "±") -> str:
    if not math.isfinite(mean):
        return DASH
    text = f"{mean:.{digits}f}"
    if math.isfinite(std):
        text += f" {pm} {std:.{digits}f}"
    return text


def paper_table(summary: pd.DataFrame, scenarios: list[str], methods: list[str], spec: TableSpec,
                method_types: dict[str, str] | None = None, only_defined: bool = False) -> PaperTable:
    """Build one table from summary.parquet's rows. `only_defined` drops scenario columns where no
    method has the figure (e.g. ARI without ground-truth groups)."""
    method_types = method_types or {}
    lookup = {(r.method, r.scenario): r for r in summary.itertuples(index=False)}
    mean_col, std_col = f"{spec.figure}_mean", f"{spec.figure}_std"
    cells: dict[tuple[str, str], Cell] = {}
    for scenario in scenarios:
        for method in methods:
            row = lookup.get((method, scenario))
            mean = float(getattr(row, mean_col)) if row is not None else float("nan")
            std = float(getattr(row, std_col)) if row is not None else float("nan")
            mean = mean * spec.scale if math.isfinite(mean) else float("nan")
            std = std * spec.scale if math.isfinite(std) else float("nan")
            cells[(method, scenario)] = Cell(mean, std, format_mean_std(mean, std, spec.digits))
    if only_defined:
        scenarios = [s for s in scenarios if any(not cells[(m, s)].missing for m in methods)]
    reference = [m for m in methods if is_reference(method_types.get(m, m))]
    table = PaperTable(spec, list(scenarios), list(methods), cells, reference)
    for scenario in table.scenarios:
        _mark_best(table, scenario)
    return table


def _mark_best(table: PaperTable, scenario: str) -> None:
    digits = table.spec.digits
    present = [m for m in table.methods if not table.cells[(m, scenario)].missing]
    candidates = [m for m in present if m not in table.reference]
    if not candidates:
        return
    printed = {m: round(table.cells[(m, scenario)].mean, digits) for m in candidates}
    best = max(printed.values()) if table.spec.higher_is_better else min(printed.values())
    for m in candidates:
        if printed[m] == best:
            table.cells[(m, scenario)].bold = True


def table_specs(entries) -> tuple[TableSpec, ...]:
    """TableSpecs of a spec's `report.tables` entries (None: the personalized-accuracy table).
    A table's key is its figure, with its position appended when a figure is listed twice."""
    if not entries:
        return (ACCURACY,)
    figures = [e.figure for e in entries]
    return tuple(TableSpec(e.figure if figures.count(e.figure) == 1 else f"{e.figure}_{i + 1}", e.title,
                           e.figure, e.scale, e.digits, higher_is_better=e.figure not in LOWER_IS_BETTER)
                 for i, e in enumerate(entries))


def paper_tables(summary: pd.DataFrame, scenarios: list[str], methods: list[str],
                 method_types: dict[str, str] | None = None,
                 ari_methods: list[str] | None = None,
                 tables: tuple[TableSpec, ...] = (ACCURACY,)) -> list[PaperTable]:
    """The `tables` (default: personalized accuracy; a spec's `report.tables`) and, when any
    scenario has ground-truth groups and no table shows ARI already, the ARI table. The ARI
    table lists `ari_methods` (default: all), e.g. only the methods that cluster clients: a
    single-cluster method's ARI is 0 by construction."""
    specs, tables = tables, [paper_table(summary, scenarios, methods, t, method_types) for t in tables]
    if any(t.figure == ARI.figure for t in specs):
        return tables
    ari_methods = methods if ari_methods is None else [m for m in methods if m in ari_methods]
    if ari_methods:
        ari = paper_table(summary, scenarios, ari_methods, ARI, method_types, only_defined=True)
        if ari.scenarios:
            tables.append(ari)
    return tables


# --------------------------------------------------------------------------- renderers


def to_markdown(table: PaperTable) -> str:
    header = ["method", *table.scenarios]
    lines = [f"**{table.title}**", "", "| " + " | ".join(header) + " |",
             "|" + "|".join([":---"] + [":---:"] * len(table.scenarios)) + "|"]
    for method in table.methods:
        cells = []
        for scenario in table.scenarios:
            cell = table.cell(method, scenario)
            cells.append(f"**{cell.text}**" if cell.bold else cell.text)
        name = f"{method} (reference)" if method in table.reference else method
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines) + "\n"


_LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                   "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)


def to_latex(table: PaperTable, label: str | None = None) -> str:
    n = len(table.scenarios)
    lines = [r"\begin{table}[t]", r"\centering",
             rf"\caption{{{latex_escape(table.title)}}}".replace("±", r"$\pm$"),
             rf"\label{{{label or 'tab:' + table.spec.key}}}",
             rf"\begin{{tabular}}{{l{'c' * n}}}", r"\toprule",
             " & ".join(["Method", *(latex_escape(s) for s in table.scenarios)]) + r" \\", r"\midrule"]
    for method in table.methods:
        cells = []
        for scenario in table.scenarios:
            cell = table.cell(method, scenario)
            text = "--" if cell.missing else format_mean_std(cell.mean, cell.std, table.spec.digits, r"$\pm$")
            cells.append(rf"\textbf{{{text}}}" if cell.bold else text)
        name = latex_escape(method) + (r"$^\dagger$" if method in table.reference else "")
        lines.append(" & ".join([name, *cells]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if table.reference:
        lines.append(r"\par\smallskip{\footnotesize $^\dagger$ reference (knows the true groups); not marked best.\par}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def to_csv(tables: list[PaperTable]) -> str:
    frames = []
    for table in tables:
        rows = [{"table": table.spec.key, "method": m,
                 **{s: table.cell(m, s).text for s in table.scenarios}} for m in table.methods]
        frames.append(pd.DataFrame(rows, columns=["table", "method", *table.scenarios]))
    # Columns are the union of the tables' scenarios (the ARI table may have fewer).
    frame = pd.concat(frames, ignore_index=True)
    return frame.to_csv(index=False, na_rep="", lineterminator="\n")


def write_tables(tables: list[PaperTable], out_dir: str | Path) -> list[Path]:
    """Write summary.csv, summary.md and summary.tex into `out_dir` (atomically)."""
    out = Path(out_dir)
    md = "\n".join(to_markdown(t) for t in tables)
    if any(t.reference for t in tables):
        md += "\nreference: knows the true groups; never marked best.\n"
    tex = "% generated by `cflpipe report`; needs \\usepackage{booktabs}\n" + "\n".join(to_latex(t) for t in tables)
    paths = [out / "summary.csv", out / "summary.md", out / "summary.tex"]
    for path, text in zip(paths, (to_csv(tables), md, tex)):
        store.write_text(path, text)
    return paths
