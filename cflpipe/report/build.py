"""`cflpipe report`'s entry point, kept where the CLI and tests import it from. The report is built
in report/page.py (the page and its files) from report/sections.py (what each section shows),
report/figures.py (the plotly figures, with report/plotting.py) and report/view.py (the queries
over the aggregate tables)."""

from cflpipe.report.page import SECTIONS, build_report, render_report, shown_spec_path
from cflpipe.report.plotting import byte_unit
from cflpipe.report.view import Sweep, find_sweeps

__all__ = ["build_report", "render_report", "find_sweeps", "Sweep", "SECTIONS", "byte_unit", "shown_spec_path"]
