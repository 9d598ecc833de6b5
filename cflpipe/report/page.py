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

Sections (element ids), results first: setup, tuning (with a `tuning:` section: chosen values,
tuning curves, every trial), accuracy (personalized and global accuracy and
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
import re
from pathlib import Path
from typing import Any

import pandas as pd

from cflpipe import __version__, store
from cflpipe.errors import CflpipeError
from cflpipe.report.aggregate import aggregate_dir, read_aggregate
from cflpipe.report.robustness import write_map_tables
from cflpipe.report.sections import Sections
from cflpipe.report.tables import ALPHA, TIE_MARK, PaperTable, is_reference, write_tables
from cflpipe.report.view import AggregateView
from cflpipe.spec import Spec

SECTIONS = (("glance", "At a glance"), ("setup", "Setup"), ("tuning", "Tuning"), ("accuracy", "Accuracy & loss vs round"), ("comparison", "Final comparison"),
            ("ranking", "Average rank"), ("clients", "Per-client accuracy"), ("clustering", "Clustering"),
            ("drift", "Groups that change"), ("robustness", "Robustness map"), ("communication", "Communication & time"),
            ("intra-inter", "Intra- vs inter-cluster accuracy"),
            ("sweeps", "Hyper-parameter sweeps"), ("overview", "Scenarios & labels"))
PLOT_CONFIG = {"responsive": True, "displaylogo": False, "showLink": False,
               "modeBarButtonsToRemove": ["sendDataToCloud"]}


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


def render_report(spec: Spec, tables: dict[str, pd.DataFrame]) -> tuple[str, list[PaperTable], Any, list[str]]:
    """The page's HTML, the paper tables, the robustness map (None without one) and "At a glance"
    as lines of text, from the aggregate tables (no files written)."""
    import plotly

    view = AggregateView(spec, tables)
    sections = Sections(view)
    glance = sections.glance()  # before any figure: it draws none, and figure ids follow the build order
    setup = sections.setup()
    tuning = sections.tuning()
    paper, details = sections.comparison()
    context = {
        "setup": setup, "glance": glance, "tuning": tuning,
        "title": "cflpipe report", "description": spec.description or "", "version": __version__,
        "plotly_version": plotly.__version__,
        "seeds": list(spec.seeds),
        "n_runs": len(view.runs), "accuracy": sections.accuracy(),
        "paper_tables": paper, "details": details, "ranking": sections.ranking(), "clients": sections.clients(),
        "clustering": sections.clustering(), "drift": (drift := sections.drift()), "robustness": (robustness := sections.robustness()),
        "communication": sections.communication(), "intra_inter": sections.intra_inter(),
        "sweeps": sections.sweeps(), "scenarios": sections.overview(), "plot_config": json.dumps(PLOT_CONFIG, sort_keys=True),
        "alpha": f"{ALPHA:g}", "tie_mark": TIE_MARK,
        "reference_types": sorted({t for t in view.method_types.values() if is_reference(t)}), "results_dir": spec.results_dir,
        "spec_file": shown_spec_path(spec._source),
    }
    # The figures are drawn in the page's order above; the sections without content are left out.
    context["sections"] = [(key, name) for key, name in SECTIONS
                           if (key != "tuning" or tuning is not None) and (key != "drift" or context["drift"] is not None)]
    html = _environment().get_template("index.html.j2").render(plotly_js=plotly_bundle(), **context)
    return html, paper, None if robustness is None else robustness["map"], glance_lines(glance)


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
    html, paper, rmap, glance = render_report(spec, tables)
    out = report_dir(spec)
    write_tables(paper, out / "tables")
    write_map_tables(rmap, {m: spec.method_label(m) for m in spec.methods}, out / "tables")
    store.write_text(out / GLANCE_FILE, "".join(f"{line}\n" for line in glance))
    store.write_text(out / "index.html", html)
    return out / "index.html"


# "At a glance" as text: what `cflpipe report` prints, so the end of a workflow shows who won.
GLANCE_FILE = "glance.txt"


def glance_lines(glance: dict[str, Any]) -> list[str]:
    """The report's "At a glance" table and rank sentence, one line per scenario and figure."""
    lines = []
    for row in glance["rows"]:
        for name, leader in (("personalized accuracy", row["accuracy"]), ("ARI", row["ari"]),
                             ("new clients' accuracy", row.get("new")),
                             ("moved clients' accuracy at the end", row.get("movers"))):
            if leader is None:
                continue
            if name == "ARI" and leader["next"] is None and leader["best"].startswith("none recovered"):
                lines.append(f"{row['scenario']}: ARI: {leader['best']} {leader['value']}; {leader['verdict']}")
                continue
            also = f" ({leader['best_also']})" if leader.get("best_also") else ""
            runner = f"; runner-up {leader['next']} {leader['next_value']}" if leader["next"] else ""
            runner += f" ({leader['next_also']})" if leader["next"] and leader.get("next_also") else ""
            lines.append(f"{row['scenario']}: best {name} {leader['best']} {leader['value']}{also}{runner} "
                         f"({leader['verdict']})")
    if (rank := glance["rank"]) is not None:
        then = f", then {rank['next']} ({rank['next_average']})" if rank["next"] else ""
        lines.append(f"best average rank over {rank['scenarios']} scenario{'s' if rank['scenarios'] != 1 else ''}: "
                     f"{rank['method']} ({rank['average']}){then}; {rank['test']}")
    return lines
