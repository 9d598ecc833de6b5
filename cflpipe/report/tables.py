"""Paper-style tables from the per-seed final figures: rows = methods, columns = scenarios, cells
"mean ± std" over seeds.

Tables: by default every headline figure (HEADLINE_TABLES: personalized and global accuracy,
macro F1, intra- and inter-cluster accuracy, ARI, total bytes, seconds per round), or the figures
a spec lists under `report.tables` with its own titles (then ARI follows unless listed). ARI
shows only the methods that cluster clients (in the report; a single-cluster method's ARI is 0 by
construction); a scenario column where no method has the figure (ARI or intra/inter without
ground-truth groups) is left out, and so is a table with no column left.

Statistics. A cell is the mean and the sample standard deviation (ddof = 1) over the seeds where
the figure is defined; with a single seed there is no std (the cell shows the mean only). Every
caption states n, the number of seeds (each cell says its own n when they differ).

Best. In each column, among the methods that are not references (a reference is told the true
groups, such as the oracle: shown, never marked), the best mean (highest, or lowest for bytes and
time; none for inter-cluster accuracy, where neither direction is better) is compared with every
other method by a two-sided paired t-test over the seeds both have (scipy.stats.ttest_rel; the
pairing removes what a seed does to every method, e.g. its client sampling). It is **bold** only
when every test gives p < ALPHA; otherwise the best and each method it is not separated from are
marked tied (TIE_MARK). Differences that are the same on every seed count as separated (p = 0),
identical values as tied (p = 1). With fewer than MIN_TEST_SEEDS (3) seeds nothing is tested and
nothing marked: a paired t-test on two seeds has one degree of freedom, and marked a 26-point
gap (54.5 ± 0.4 against 28.8 ± 7.4) as tied, which reads as a bug rather than as too few seeds.
The paired t-test rather than the Wilcoxon signed-rank test: with the 3–5 seeds of a typical
benchmark the exact Wilcoxon test cannot reach p < 0.05 (its smallest two-sided p with 5 pairs
is 0.0625), so it would never mark a best. No correction for multiple comparisons is applied.

Written as `summary.md` (GitHub Markdown, `**bold**`, footnotes), `summary.tex` (booktabs,
`\\textbf{}`, needs `\\usepackage{booktabs}`) and `summary.csv` (tidy: one row per table ×
scenario × method with mean, std, n, mark and the p-value against the column's best). A method
that does not run on a scenario, or a figure undefined there, prints as "—" ("--" in LaTeX).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cflpipe import store


def is_reference(method_type: str) -> bool:
    """A method told the ground-truth groups (capability needs_groups): a reference, never "best"."""
    from cflpipe.registry import METHODS, all_methods

    info = METHODS.get(method_type) or all_methods().get(method_type)
    return bool(info and info.capabilities.needs_groups)


def is_soft(method_type: str) -> bool:
    """A method whose clients belong to every cluster in shares (capability soft, FedSoft)."""
    from cflpipe.registry import METHODS, all_methods

    info = METHODS.get(method_type) or all_methods().get(method_type)
    return bool(info and info.capabilities.soft)


def is_clustered(method_type: str) -> bool:
    """A method that declares it clusters clients (capability clustered), whether or not it did."""
    from cflpipe.registry import METHODS, all_methods

    info = METHODS.get(method_type) or all_methods().get(method_type)
    return bool(info and info.capabilities.clustered)


DASH = "—"
ALPHA = 0.05
TIE_MARK = "≈"
# Seeds below which no best is tested or marked (see the module doc).
MIN_TEST_SEEDS = 3
TEST_NOTE = (f"Bold: the best mean, separated from every other method by a two-sided paired t-test over "
             f"seeds (p < {ALPHA:g}); {TIE_MARK}: tied, the best and the methods it is not separated from "
             f"(p ≥ {ALPHA:g}); nothing is marked with fewer than {MIN_TEST_SEEDS} seeds.")
REFERENCE_NOTE = "reference: knows the true groups; never marked best."
# Figures computed from clusters.parquet's assignment, which soft methods fill with each client's
# largest share.
ASSIGNMENT_FIGURES = ("ari", "nmi", "ami", "n_clusters")


@dataclass(frozen=True)
class TableSpec:
    key: str            # short name: file block / html id
    title: str
    figure: str         # per-seed figure (runs.parquet's final figures, or seconds_per_round)
    scale: float        # multiply mean and std (100 for %)
    digits: int
    direction: int = 1  # +1: the highest mean is best, -1: the lowest, 0: no best

    @property
    def higher_is_better(self) -> bool:
        return self.direction > 0


ACCURACY = TableSpec("accuracy", "Personalized accuracy (%)", "acc_macro", 100.0, 1)
ARI = TableSpec("ari", "Adjusted Rand index of the clustering vs the ground-truth groups", "ari", 1.0, 2)
# Where a scenario holds new clients out (scenario new_clients): what each method serves them,
# and whether it places them with their group ("—": the method has no rule for them).
NEW_CLIENT_TABLES = (
    TableSpec("new_accuracy", "New clients, never trained with: personalized accuracy (%) of what each method serves "
                              "them", "new_acc_macro", 100.0, 1),
    TableSpec("new_joined", "New clients placed in the cluster of most of their true group's participants (share)",
              "new_joined", 1.0, 2))
# Where a scenario's groups change (scenario drift): what the moved clients end with, and whether
# each method has placed them with their new group by then.
DRIFT_TABLES = (
    TableSpec("drift_moved", "Groups that change: the moved clients' personalized accuracy (%) at the end",
              "moved_acc_macro", 100.0, 1),
    TableSpec("drift_joined", "Groups that change: moved clients placed in the cluster of most of their new group "
                              "(share, at the end)", "drift_joined", 1.0, 2))
HEADLINE_TABLES = (
    ACCURACY,
    TableSpec("global_accuracy", "Global accuracy (%): every model on all clients' test data", "global_acc_mean",
              100.0, 1),
    TableSpec("f1", "Macro F1 (%)", "f1_macro", 100.0, 1),
    TableSpec("intra", "Intra-cluster accuracy (%): each client's model on its own group's test data",
              "intra_acc", 100.0, 1),
    # No best: a clustered model that does worse on the other groups' data has specialised.
    TableSpec("inter", "Inter-cluster accuracy (%): each client's model on the other groups' test data",
              "inter_acc", 100.0, 1, direction=0),
    ARI,
    TableSpec("bytes", "Communication: MB sent over all rounds (down + up)", "bytes_total", 1e-6, 2, direction=-1),
    TableSpec("time", "Wall-clock seconds per round", "seconds_per_round", 1.0, 3, direction=-1),
)
# Figures where the smallest value is the best (traffic, time, distance from the true mixture
# weights) or that have no best.
LOWER_IS_BETTER = ("bytes_down_total", "bytes_up_total", "bytes_total", "seconds_per_round", "mixture_error")
NO_BEST = ("inter_acc", "n_clusters")


# Marks a cell of a clustered method that never clustered in some seed: its figures are those of
# the method without clusters (often FedAvg's), not of a clustering.
ONE_CLUSTER_MARK = "‡"


def direction_of(figure: str) -> int:
    return -1 if figure in LOWER_IS_BETTER else 0 if figure in NO_BEST else 1


@dataclass
class Cell:
    mean: float
    std: float
    n: int
    text: str
    mark: str = ""                # "best" (bold), "tied" or ""
    p: float = float("nan")       # paired t-test against the column's best (NaN: not tested)
    one_cluster: int = 0          # seeds whose clustering came to none (summary's `degenerate`)

    @property
    def missing(self) -> bool:
        return not math.isfinite(self.mean)

    @property
    def bold(self) -> bool:
        return self.mark == "best"

    @property
    def tied(self) -> bool:
        return self.mark == "tied"


@dataclass
class PaperTable:
    spec: TableSpec
    scenarios: list[str]
    methods: list[str]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)  # (method, scenario)
    reference: list[str] = field(default_factory=list)  # methods never marked best
    method_labels: dict[str, str] = field(default_factory=dict)
    scenario_labels: dict[str, str] = field(default_factory=dict)
    soft: list[str] = field(default_factory=list)  # methods whose clustering is soft (shares)
    protocol: str = ""  # how the hyper-parameters were set (report/sections.protocol_caption)

    @property
    def title(self) -> str:
        return self.spec.title

    def method_label(self, method: str) -> str:
        return self.method_labels.get(method, method)

    def scenario_label(self, scenario: str) -> str:
        return self.scenario_labels.get(scenario, scenario)

    def cell(self, method: str, scenario: str) -> Cell:
        return self.cells[(method, scenario)]

    def best(self, scenario: str) -> list[str]:
        return [m for m in self.methods if self.cells[(m, scenario)].bold]

    def shown(self) -> list[Cell]:
        return [self.cells[(m, s)] for m in self.methods for s in self.scenarios if not self.cells[(m, s)].missing]

    @property
    def seeds(self) -> int | None:
        """The number of seeds of every cell, or None when cells differ (each cell then says its n)."""
        counts = {c.n for c in self.shown()}
        return counts.pop() if len(counts) == 1 else None

    @property
    def caption(self) -> str:
        n = self.seeds
        over = f"n = {n} seed{'s' if n != 1 else ''}" if n is not None else "n seeds as given per cell"
        std = "mean ± sample std (n − 1)" if n is None or n > 1 else "mean (one seed: no std)"
        return f"{self.title}; {std} over {over}" + (f"; {self.protocol}" if self.protocol else "")

    def cell_text(self, cell: Cell, pm: str = "±") -> str:
        text = format_mean_std(cell.mean, cell.std, self.spec.digits, pm)
        if self.seeds is None and not cell.missing:
            text += f" (n={cell.n})"
        if cell.one_cluster and not cell.missing:
            text += f" {ONE_CLUSTER_MARK}"
        return text

    @property
    def notes(self) -> list[str]:
        """Footnotes: how the best was chosen, and the reference mark when there is one."""
        notes = []
        compared = [m for m in self.methods if m not in self.reference]
        if self.spec.direction == 0:
            notes.append("No best is marked in this table.")
        elif len(compared) < 2:
            notes.append("Fewer than two methods to compare (references aside): no best is marked.")
        elif any(c.n >= MIN_TEST_SEEDS for c in self.shown()):
            notes.append(TEST_NOTE)
        elif any(c.n == 2 for c in self.shown()):
            notes.append(f"Two seeds: too few to test (a paired t-test over 2 seeds has one degree of freedom), so "
                         f"no best is marked; give {MIN_TEST_SEEDS} or more.")
        else:
            notes.append("One seed: no test is possible, so no best is marked.")
        if self.reference:
            notes.append(REFERENCE_NOTE)
        soft = [m for m in self.methods if m in self.soft]
        if soft and self.spec.figure in ASSIGNMENT_FIGURES:
            notes.append(f"{', '.join(map(self.method_label, soft))}: soft clustering (every client in every cluster, "
                         f"in shares: mixture.parquet); scored with each client's largest share.")
        flagged = [(m, s) for m in self.methods for s in self.scenarios
                   if self.cells[(m, s)].one_cluster and not self.cells[(m, s)].missing]
        if flagged:
            cases = ", ".join(f"{self.method_label(m)} on {self.scenario_label(s)} "
                              f"({self.cells[(m, s)].one_cluster} of {self.cells[(m, s)].n} seeds)" for m, s in flagged)
            notes.append(f"{ONE_CLUSTER_MARK} no clustering at the end (one cluster throughout or by the end, "
                         f"about one cluster per client, or a gate that never let it cluster; the runs' "
                         f"summary.json says which): {cases}.")
        return notes


def fixed(value: float, digits: int) -> str:
    """`value` to `digits` decimals, never "-0.00": a mean ARI of −0.001 reads as 0.00."""
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def format_mean_std(mean: float, std: float, digits: int, pm: str = "±") -> str:
    if not math.isfinite(mean):
        return DASH
    text = fixed(mean, digits)
    if math.isfinite(std):
        text += f" {pm} {fixed(std, digits)}"
    return text


def mean_std_n(values) -> tuple[float, float, int]:
    """Mean, sample std (ddof = 1; NaN for one value) and count of the finite `values`."""
    values = np.asarray(values, dtype="float64")
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return float("nan"), float("nan"), 0
    std = float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")
    return float(np.mean(values)), std, len(values)


def paired_p(a: dict[int, float], b: dict[int, float]) -> float:
    """Two-sided paired t-test of two methods' values over the seeds both have; NaN below two pairs."""
    from scipy.stats import ttest_rel

    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return float("nan")
    x = np.array([a[k] for k in seeds], dtype="float64")
    y = np.array([b[k] for k in seeds], dtype="float64")
    d = x - y
    if np.all(d == d[0]):  # no spread: t is undefined; the same difference on every seed
        return 1.0 if d[0] == 0 else 0.0
    with warnings.catch_warnings():  # differences equal up to rounding: scipy warns, t is still right
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(ttest_rel(x, y).pvalue)


def mark_best(values: dict[str, dict[int, float]], direction: int, reference: set[str] | frozenset = frozenset()
              ) -> dict[str, tuple[str, float]]:
    """{method: (mark, p against the best)} for one column of per-seed values {method: {seed: value}}:
    "best" when the best mean is separated from every other candidate, else "tied" for the best and
    those it is not separated from (see the module doc)."""
    out = {m: ("", float("nan")) for m in values}
    candidates = {m: v for m, v in values.items() if v and m not in reference}
    if direction == 0 or len(candidates) < 2:
        return out
    means = {m: float(np.mean(list(v.values()))) for m, v in candidates.items()}
    best = max(means, key=lambda m: direction * means[m])  # first in the given order on equal means
    if len(candidates[best]) < MIN_TEST_SEEDS:
        return out
    tests = {m: paired_p(candidates[best], v) for m, v in candidates.items() if m != best}
    if all(p < ALPHA for p in tests.values()):
        out[best] = ("best", float("nan"))
        out.update({m: ("", p) for m, p in tests.items()})
        return out
    out[best] = ("tied", float("nan"))
    for m, p in tests.items():
        out[m] = ("" if p < ALPHA else "tied", p)  # p NaN (no common seeds) is not a separation
    return out


def seed_values(per_seed: pd.DataFrame, scenario: str, method: str, figure: str, scale: float = 1.0
                ) -> dict[int, float]:
    """{seed: value × scale} of the finite values of `figure` for one scenario × method."""
    if figure not in per_seed.columns:
        return {}
    rows = per_seed[(per_seed["scenario"] == scenario) & (per_seed["method"] == method)]
    return {int(k): float(v) * scale for k, v in zip(rows["seed"], rows[figure].to_numpy(dtype="float64"))
            if math.isfinite(v)}


def one_cluster_seeds(per_seed: pd.DataFrame, scenario: str, method: str) -> int:
    """Seeds whose run says its clustering came to none (runs.parquet's `degenerate`, from summary.json)."""
    if "degenerate" not in per_seed.columns:
        return 0
    rows = per_seed[(per_seed["scenario"] == scenario) & (per_seed["method"] == method)]
    return int((rows["degenerate"].fillna("").astype(str) != "").sum())


def paper_table(per_seed: pd.DataFrame, scenarios: list[str], methods: list[str], spec: TableSpec,
                method_types: dict[str, str] | None = None, only_defined: bool = False,
                method_labels: dict[str, str] | None = None,
                scenario_labels: dict[str, str] | None = None, protocol: str = "") -> PaperTable:
    """Build one table from per-seed values (`scenario`, `method`, `seed` and figure columns: the
    aggregate's runs.parquet with timing's seconds_per_round). `only_defined` drops scenario
    columns where no method has the figure (e.g. ARI without ground-truth groups)."""
    method_types = method_types or {}
    reference = [m for m in methods if is_reference(method_types.get(m, m))]
    cells: dict[tuple[str, str], Cell] = {}
    for scenario in scenarios:
        column = {m: seed_values(per_seed, scenario, m, spec.figure, spec.scale) for m in methods}
        marks = mark_best(column, spec.direction, set(reference))
        for m in methods:
            mean, std, n = mean_std_n(list(column[m].values()))
            mark, p = marks[m]
            cells[(m, scenario)] = Cell(mean, std, n, format_mean_std(mean, std, spec.digits), mark, p,
                                        one_cluster_seeds(per_seed, scenario, m))
    if only_defined:
        scenarios = [s for s in scenarios if any(not cells[(m, s)].missing for m in methods)]
    table = PaperTable(spec, list(scenarios), list(methods), cells, reference, dict(method_labels or {}),
                       dict(scenario_labels or {}), [m for m in methods if is_soft(method_types.get(m, m))], protocol)
    for c in table.cells.values():
        c.text = table.cell_text(c)
    return table


def table_specs(entries) -> tuple[TableSpec, ...]:
    """TableSpecs of a spec's `report.tables` entries (None: every headline table).
    A table's key is its figure, with its position appended when a figure is listed twice."""
    if not entries:
        return HEADLINE_TABLES
    figures = [e.figure for e in entries]
    return tuple(TableSpec(e.figure if figures.count(e.figure) == 1 else f"{e.figure}_{i + 1}", e.title,
                           e.figure, e.scale, e.digits, direction=direction_of(e.figure))
                 for i, e in enumerate(entries))


def paper_tables(per_seed: pd.DataFrame, scenarios: list[str], methods: list[str],
                 method_types: dict[str, str] | None = None,
                 ari_methods: list[str] | None = None,
                 tables: tuple[TableSpec, ...] = HEADLINE_TABLES,
                 method_labels: dict[str, str] | None = None,
                 scenario_labels: dict[str, str] | None = None, protocol: str = "") -> list[PaperTable]:
    """The `tables` (default: the headline figures; a spec's `report.tables`) and, when no table
    shows ARI already, the ARI table. ARI tables list `ari_methods` (default: all), e.g. only the
    methods that cluster clients: a single-cluster method's ARI is 0 by construction. Columns
    where no method has the figure are dropped, and tables left without columns."""
    specs = tuple(tables)
    if not any(t.figure == ARI.figure for t in specs):
        specs += (ARI,)
    ari_methods = methods if ari_methods is None else [m for m in methods if m in ari_methods]
    out = []
    for spec in specs:
        rows = ari_methods if spec is ARI else methods
        if not rows:
            continue
        table = paper_table(per_seed, scenarios, rows, spec, method_types, only_defined=True,
                            method_labels=method_labels, scenario_labels=scenario_labels, protocol=protocol)
        if table.scenarios:
            out.append(table)
    return out


# --------------------------------------------------------------------------- renderers


def to_markdown(table: PaperTable) -> str:
    header = ["method", *(table.scenario_label(s) for s in table.scenarios)]
    lines = [f"**{table.caption}**", "", "| " + " | ".join(_md(h) for h in header) + " |",
             "|" + "|".join([":---"] + [":---:"] * len(table.scenarios)) + "|"]
    for method in table.methods:
        cells = []
        for scenario in table.scenarios:
            cell = table.cell(method, scenario)
            cells.append(f"**{cell.text}**" if cell.bold else f"{cell.text} {TIE_MARK}" if cell.tied else cell.text)
        name = _md(table.method_label(method)) + (" (reference)" if method in table.reference else "")
        lines.append("| " + " | ".join([name, *cells]) + " |")
    for note in table.notes:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


_LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                   "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "|": r"\textbar{}", "<": r"\textless{}",
                   ">": r"\textgreater{}"}
_LATEX_SYMBOLS = {"‡": r"$^\ddagger$", "±": r"$\pm$", "≈": r"$\approx$", "≥": r"$\geq$", "−": r"$-$", "β": r"$\beta$",
                  "μ": r"$\mu$", "α": r"$\alpha$", "λ": r"$\lambda$", "τ": r"$\tau$"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIALS.get(ch, _LATEX_SYMBOLS.get(ch, ch)) for ch in text)


def to_latex(table: PaperTable, label: str | None = None) -> str:
    n = len(table.scenarios)
    lines = [r"\begin{table}[t]", r"\centering",
             rf"\caption{{{latex_escape(table.caption)}}}",
             rf"\label{{{label or 'tab:' + table.spec.key}}}",
             rf"\begin{{tabular}}{{l{'c' * n}}}", r"\toprule",
             " & ".join(["Method", *(latex_escape(table.scenario_label(s)) for s in table.scenarios)]) + r" \\",
             r"\midrule"]
    for method in table.methods:
        cells = []
        for scenario in table.scenarios:
            cell = table.cell(method, scenario)
            text = "--" if cell.missing else latex_escape(table.cell_text(cell))
            cells.append(rf"\textbf{{{text}}}" if cell.bold else text + r"$^{\approx}$" if cell.tied else text)
        name = latex_escape(table.method_label(method)) + (r"$^\dagger$" if method in table.reference else "")
        lines.append(" & ".join([name, *cells]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    notes = [latex_escape(note) for note in table.notes]
    notes = [note.replace(r"Bold:", r"\textbf{Bold}:").replace(r"$\approx$:", r"$^{\approx}$:")
             .replace("reference:", r"$^\dagger$ reference:") for note in notes]
    lines.append(r"\par\smallskip{\footnotesize " + " ".join(notes) + r"\par}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ("table", "figure", "scenario", "scenario_label", "method", "method_label", "reference", "n",
               "mean", "std", "text", "mark", "p_vs_best")


def to_csv(tables: list[PaperTable]) -> str:
    """Tidy: one row per table × scenario × method, in the tables' units (mean and std scaled as
    printed); `mark` is best, tied or empty; `p_vs_best` the paired t-test's p against the column's
    best (empty for the best itself and where nothing was tested)."""
    rows = []
    for table in tables:
        for scenario in table.scenarios:
            for method in table.methods:
                cell = table.cell(method, scenario)
                rows.append({"table": table.spec.key, "figure": table.spec.figure, "scenario": scenario,
                             "scenario_label": table.scenario_label(scenario), "method": method,
                             "method_label": table.method_label(method),
                             "reference": method in table.reference, "n": cell.n,
                             "mean": cell.mean, "std": cell.std, "text": cell.text, "mark": cell.mark,
                             "p_vs_best": cell.p})
    frame = pd.DataFrame(rows, columns=list(CSV_COLUMNS))
    return frame.to_csv(index=False, na_rep="", float_format="%.10g", lineterminator="\n")


def write_tables(tables: list[PaperTable], out_dir: str | Path) -> list[Path]:
    """Write summary.csv, summary.md and summary.tex into `out_dir` (atomically)."""
    out = Path(out_dir)
    md = "\n".join(to_markdown(t) for t in tables)
    tex = "% generated by `cflpipe report`; needs \\usepackage{booktabs}\n" + "\n".join(to_latex(t) for t in tables)
    paths = [out / "summary.csv", out / "summary.md", out / "summary.tex"]
    for path, text in zip(paths, (to_csv(tables), md, tex)):
        store.write_text(path, text)
    return paths



def verdict(best: dict[int, float], other: dict[int, float]) -> str:
    """The paired test of a best method against another, in words: separated (p), not separated
    at n seeds (p), or too few seeds to test."""
    n = len(set(best) & set(other))
    if n < MIN_TEST_SEEDS:
        return f"too few seeds to test (n = {n})"
    p = paired_p(best, other)
    if p < ALPHA:
        return f"separated by a paired t-test over {n} seeds (p = {p:.2g})"
    return f"not separated at n = {n} (p = {p:.2g})"
