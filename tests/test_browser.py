"""The HTML report in a real browser: headless Chromium opens results/report/index.html from disk.

Method: Chromium is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: the
browser reads JSON commands on fd 3 and writes replies and events on fd 4, each message ended by
a NUL byte), with no port, no network and no extra Python package. While the page loads we
record
- `Runtime.exceptionThrown` (uncaught exceptions), `Runtime.consoleAPICalled` of type error or
  assert (the report's own draw loop logs a failing figure with console.error), and
  `Log.entryAdded` of level error (e.g. a resource that failed to load);
- `Network.requestWillBeSent`: every URL the page asked for, which must all be file: or data:
  (the page is self-contained and works offline).
After the load event we poll the DOM until every `div.cfl-fig` outside a collapsed `<details>`
holds plotly's rendered `svg.main-svg` (scripts ran and drew) while those inside one (the label
histograms) are not drawn yet, then open every `<details>` and wait for the rest to draw at their
container's width. Then take a 1400×2400 screenshot with `Page.captureScreenshot` and check it
is not blank (pixel variance, share of non-white pixels). Then, on the drawn page, the Setup
section (its tables, provenance and the key of method styles) is there and visible, the new
views are drawn with what the aggregate holds (training loss per round, accuracy against
cumulative bytes on an axis from 0, per-client accuracy boxes, the ranking table; a
critical-difference diagram on a page whose ranking the Friedman test rejects), every legend
fits (plotly draws a scrollbar when a legend is taller than its room), and the styles plotly
actually drew (`_fullData` of every figure, box plots and the CD diagram included) give a method
one colour × dash × marker in every figure and two methods never the same one: on the tiny report
of test_report.py, and on a one-seed report of 20 method entries (families with more entries
than colours, so dashes and markers must tell them apart).

Skipped when no Chromium binary is installed, except under CI=true, where that is a failure (CI
installs Debian's `chromium`; a browser test that silently skips there checks nothing).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WIDTH, HEIGHT = 1400, 2400
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
                  "--disable-default-apps", "--mute-audio", "--hide-scrollbars")


def chromium_binary() -> str | None:
    for name in (os.environ.get("CFLPIPE_CHROMIUM"), "/usr/bin/chromium", "chromium", "chromium-browser",
                 "google-chrome", "google-chrome-stable"):
        if name and (path := shutil.which(name)):
            return path
    return None


class DevTools:
    """Minimal Chrome DevTools protocol client over --remote-debugging-pipe."""

    def __init__(self, binary: str, profile: Path, timeout: float = 90.0):
        cmd_read, self._cmd_write = os.pipe()
        self._reply_read, reply_write = os.pipe()
        # Move the child's ends above fd 4 first so the dup2 onto 3 and 4 cannot clobber them.
        child_in, child_out = _high_dup(cmd_read), _high_dup(reply_write)
        os.close(cmd_read)
        os.close(reply_write)

        def wire_pipes():  # runs in the child before exec
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile}",
             f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            pass_fds=(3, 4), preexec_fn=wire_pipes)
        os.close(child_in)
        os.close(child_out)
        self.deadline = time.monotonic() + timeout
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def _read_message(self) -> dict:
        while b"\0" not in self._buffer:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer in time")
            ready, _, _ = select.select([self._reply_read], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._reply_read, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium closed the pipe: {self.stderr()}")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        request = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            request["sessionId"] = session
        os.write(self._cmd_write, json.dumps(request).encode() + b"\0")
        while True:
            message = self._read_message()
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_event(self, method: str, seconds: float) -> dict | None:
        end = min(self.deadline, time.monotonic() + seconds)
        seen = next((e for e in self.events if e["method"] == method), None)
        while seen is None and time.monotonic() < end:
            ready, _, _ = select.select([self._reply_read], [], [], 0.2)
            if ready or b"\0" in self._buffer:
                message = self._read_message()
                if "method" in message:
                    self.events.append(message)
                    if message["method"] == method:
                        seen = message
        return seen

    def evaluate(self, expression: str, session: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        return result["result"].get("value")

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                os.write(self._cmd_write, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
                self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            for fd in (self._cmd_write, self._reply_read):
                try:
                    os.close(fd)
                except OSError:
                    pass
            if self.proc.stderr:
                self.proc.stderr.close()


def _high_dup(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, 10)


def open_in_browser(binary: str, page: Path, profile: Path, screenshot: Path, probes: dict[str, str] | None = None
                    ) -> dict:
    """Load `page`, wait until every figure is drawn, screenshot it, evaluate the JSON `probes`
    (JavaScript expressions returning JSON text) on the drawn page; return what was observed."""
    tools = DevTools(binary, profile)
    try:
        target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            tools.send(f"{domain}.enable", {}, session)
        tools.send("Emulation.setDeviceMetricsOverride",
                   {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}, session)
        tools.send("Page.navigate", {"url": page.resolve().as_uri()}, session)
        loaded = tools.wait_event("Page.loadEventFired", 60)
        assert loaded is not None, "the page never fired its load event"
        state = _wait_drawn(tools, session, "visible")
        # Figures in collapsed <details> wait for the reader; opening them draws them.
        state["collapsed"] = json.loads(tools.evaluate(COLLAPSED_PROBE, session))
        tools.evaluate("document.querySelectorAll('details').forEach(d => { d.open = true; })", session)
        state = {**_wait_drawn(tools, session, "figures"), "collapsed": state["collapsed"],
                 "drawn_before_opening": state["drawn"], "visible_before_opening": state["visible"]}
        tools.wait_event("__never__", 0.5)  # late console messages
        shot = tools.send("Page.captureScreenshot", {"format": "png"}, session)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        found = {name: json.loads(tools.evaluate(js, session)) for name, js in (probes or {}).items()}
        return {"state": state, "events": list(tools.events), **found}
    finally:
        tools.close()


FIGURES_PROBE = ("JSON.stringify({figures: document.querySelectorAll('div.cfl-fig').length,"
                 " visible: Array.from(document.querySelectorAll('div.cfl-fig')).filter("
                 "d => !d.closest('details:not([open])')).length,"
                 " drawn: Array.from(document.querySelectorAll('div.cfl-fig')).filter("
                 "d => d.querySelector('svg.main-svg')).length,"
                 " failed: document.querySelectorAll('.fig-error').length,"
                 " plotly: typeof Plotly === 'undefined' ? null : Plotly.version,"
                 " sections: Array.from(document.querySelectorAll('main > section')).map(s => s.id)})")
# Figures inside closed <details> at load: how many, and how many of them plotly drew already.
COLLAPSED_PROBE = """JSON.stringify((() => {
  const inside = Array.from(document.querySelectorAll('details:not([open]) div.cfl-fig'));
  return {details: document.querySelectorAll('details').length,
          open: document.querySelectorAll('details[open]').length, figures: inside.length,
          drawn: inside.filter(d => d.querySelector('svg.main-svg')).length};
})())"""


def _wait_drawn(tools: "DevTools", session: str, target: str, seconds: float = 30) -> dict:
    """Poll until `target` (the key of FIGURES_PROBE: visible or all figures) are drawn or failed."""
    state = json.loads(tools.evaluate(FIGURES_PROBE, session))
    end = time.monotonic() + seconds
    while state["drawn"] + state["failed"] < state[target] and time.monotonic() < end:
        tools.wait_event("__never__", 0.3)  # let events arrive while the figures draw
        state = json.loads(tools.evaluate(FIGURES_PROBE, session))
    return state


def console_problems(events: list[dict]) -> list[str]:
    problems = []
    for e in events:
        p = e.get("params", {})
        if e["method"] == "Runtime.exceptionThrown":
            details = p.get("exceptionDetails", {})
            problems.append("uncaught: " + str(details.get("exception", {}).get("description") or details.get("text")))
        elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            problems.append("console.error: " + " ".join(str(a.get("value", a.get("description", "")))
                                                          for a in p.get("args", [])))
        elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            problems.append(f"log error: {p['entry'].get('text')} {p['entry'].get('url', '')}")
    return problems


def requested_urls(events: list[dict]) -> list[str]:
    return [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]


# Drawn styles of every scatter and box trace (plotly's resolved `_fullData`), bands and error
# bars aside; a box has no dash, so it counts as a marker-only trace (colour and marker).
STYLES_PROBE = """JSON.stringify(Array.from(document.querySelectorAll('div.cfl-fig')).flatMap(d =>
  (d._fullData || []).filter(t => (t.type === 'scatter' || t.type === 'box') && t.fill !== 'toself' && t.name).map(t => ({
    figure: d.id, name: t.name, color: (t.line || {}).color || (t.marker || {}).color,
    dash: (t.line || {}).dash || null, symbol: (t.marker || {}).symbol || null,
    mode: t.mode}))))"""
# Every legend: the height of plotly's scrollbar (0 unless the legend scrolls) and whether the
# legend lies inside its figure.
LEGENDS_PROBE = """JSON.stringify(Array.from(document.querySelectorAll('div.cfl-fig')).flatMap(d => {
  const legend = d.querySelector('g.legend'); if (!legend) return [];
  const bar = legend.querySelector('rect.scrollbar'); const a = legend.getBoundingClientRect();
  const b = d.getBoundingClientRect();
  return [{figure: d.id, scrollbar: bar ? Number(bar.getAttribute('height') || 0) : 0,
           inside: a.top >= b.top - 1 && a.bottom <= b.bottom + 1 && a.left >= b.left - 1 && a.right <= b.right + 1}];
}))"""
# The Setup section as drawn: its tables' rows, provenance facts, size and the style key's traces.
SETUP_PROBE = """JSON.stringify((() => {
  const s = document.getElementById('setup'); if (!s) return null;
  const r = s.getBoundingClientRect();
  const key = s.querySelector('div.cfl-fig');
  return {height: r.height, width: r.width, visible: getComputedStyle(s).display !== 'none',
          settings: Array.from(s.querySelectorAll('#setup-scenarios tbody th')).map(th => th.textContent),
          methods: Array.from(s.querySelectorAll('#setup-methods tbody th')).map(th => th.textContent),
          provenance: Array.from(s.querySelectorAll('dl.provenance dt')).map(dt => dt.textContent),
          text: s.innerText, key_drawn: !!(key && key.querySelector('svg.main-svg')),
          key_traces: key && key._fullData ? key._fullData.length : 0};
})())"""
# The new views as drawn: per figure its section, title, drawn width, traces (type, name, x, y of
# the resolved data) and axis ranges; the ranking section's table and notes; the label histograms.
VIEWS_PROBE = """JSON.stringify((() => {
  const figures = Array.from(document.querySelectorAll('div.cfl-fig')).map(d => {
    const layout = d._fullLayout || {};
    return {id: d.id, section: d.closest('section').id, title: (layout.title || {}).text || '',
            width: d.getBoundingClientRect().width, height: d.getBoundingClientRect().height,
            drawn: !!d.querySelector('svg.main-svg'),
            xrange: layout.xaxis ? layout.xaxis.range : null, yrange: layout.yaxis ? layout.yaxis.range : null,
            ytype: layout.yaxis ? layout.yaxis.type : null,
            traces: (d._fullData || []).map(t => ({type: t.type, name: t.name, x: t.x ? Array.from(t.x) : null,
                                                  y: t.y ? Array.from(t.y) : null, visible: t.visible}))};
  });
  const ranking = document.getElementById('ranking');
  return {figures: figures,
          ranking: {visible: ranking.getBoundingClientRect().height > 100,
                    rows: Array.from(ranking.querySelectorAll('#ranking-table tbody tr')).map(tr =>
                      Array.from(tr.children).map(c => c.textContent.trim())),
                    notes: Array.from(ranking.querySelectorAll('p.note')).map(p => p.textContent)},
          labels: Array.from(document.querySelectorAll('details.labels')).map(d => ({id: d.id, open: d.open}))};
})())"""
# The critical-difference diagram as drawn: its traces (the methods' lines from the axis to their
# labels), thick group bars (shapes), label annotations, and whether every label lies inside the
# figure (the margins make room for them).
CD_PROBE = """JSON.stringify((() => {
  const d = document.querySelector('#ranking div.cfl-fig'); if (!d) return null;
  const box = d.getBoundingClientRect();
  const labels = Array.from(d.querySelectorAll('g.annotation')).map(a => {
    const r = a.getBoundingClientRect();
    return {text: a.textContent, inside: r.left >= box.left - 1 && r.right <= box.right + 1};
  });
  return {drawn: !!d.querySelector('svg.main-svg'),
          traces: d._fullData.map(t => ({name: t.name, x: Array.from(t.x), y: Array.from(t.y)})),
          bars: d._fullLayout.shapes.filter(s => s.line.width === 4).map(s => [s.x0, s.x1]),
          labels: labels};
})())"""
# The all-final-figures tables at 1400 px: the headline figure (the first after method and
# seeds) starts inside the window, and the method's name stays in view when the table scrolls.
WIDE_TABLE_PROBE = """JSON.stringify([...document.querySelectorAll('table.details')].map(t => {
  const head = t.querySelectorAll('thead th');
  const box = t.closest('.wide');
  const name = t.querySelector('tbody th[scope=row]');
  const before = name.getBoundingClientRect().left;
  box.scrollLeft = box.scrollWidth;
  const after = name.getBoundingClientRect().left;
  box.scrollLeft = 0;
  return {first: head[2].textContent, right: head[2].getBoundingClientRect().right,
          width: window.innerWidth, scrolls: box.scrollWidth > box.clientWidth, kept: after === before};
}))"""
PROBES = {"styles": STYLES_PROBE, "legends": LEGENDS_PROBE, "setup": SETUP_PROBE, "views": VIEWS_PROBE,
          "wide": WIDE_TABLE_PROBE}


def require_chromium() -> str:
    binary = chromium_binary()
    if binary is None:
        message = "no Chromium binary (apt-get install chromium, or set CFLPIPE_CHROMIUM)"
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(f"{message}; CI=true, where the browser tests must run, not skip")
        pytest.skip(message)
    return binary


def method_styles(drawn: list[dict], labels: list[str]) -> dict[str, set]:
    """{method label: the set of (colour, dash, marker) it was drawn with} over every figure;
    line traces only (the intra/inter scatter draws markers, no line: its colour and marker)."""
    styles: dict[str, set] = {}
    for t in drawn:
        if t["name"] in labels:
            dash = t["dash"] if "lines" in (t.get("mode") or "") else None  # a box has no mode
            styles.setdefault(t["name"], set()).add((t["color"], dash, t["symbol"]))
    return styles


def check_styles(drawn: list[dict], labels: list[str]) -> None:
    styles = method_styles(drawn, labels)
    assert sorted(styles) == sorted(labels), "every method appears in some figure (at least the style key)"
    lines = {name: {s for s in found if s[1] is not None} for name, found in styles.items()}
    for name, found in lines.items():
        assert len(found) == 1, f"{name} is drawn with {len(found)} different line styles: {found}"
    drawn_lines = [next(iter(found)) for found in lines.values()]
    assert len(set(drawn_lines)) == len(drawn_lines), "two methods share colour, dash and marker"
    for name, found in styles.items():  # marker-only traces use the method's colour and marker
        line = next(iter(lines[name]))
        assert {(c, m) for c, _, m in found} == {(line[0], line[2])}, name


def check_legends(legends: list[dict]) -> None:
    assert legends, "no legend was drawn"
    for legend in legends:
        assert legend["scrollbar"] == 0, f"{legend['figure']}: the legend scrolls"
        assert legend["inside"], f"{legend['figure']}: the legend sticks out of its figure"


def _report_helpers():
    # The tiny real runs are built by test_report.py's helper (cached on disk per session).
    spec = importlib.util.spec_from_file_location("_cflpipe_test_report", Path(__file__).with_name("test_report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built_report_dir(tmp_path_factory) -> dict:
    return _report_helpers().built_report(tmp_path_factory)


@pytest.fixture(scope="module")
def report_page(built_report_dir) -> Path:
    return built_report_dir["index"]


def test_report_renders_in_chromium(report_page, tmp_path):
    binary = require_chromium()
    shot = tmp_path / "report.png"
    seen = open_in_browser(binary, report_page, tmp_path / "profile", shot, PROBES)
    state, events = seen["state"], seen["events"]

    assert console_problems(events) == []
    outside = [u for u in requested_urls(events) if not u.startswith(("file:", "data:", "about:"))]
    assert outside == [], f"the page requested non-local resources: {outside}"
    assert state["plotly"], "plotly.js was not defined on the page"
    assert state["sections"] == ["glance", "setup", "accuracy", "comparison", "ranking", "clients", "clustering",
                                 "robustness", "communication", "intra-inter", "sweeps", "overview"]
    assert state["figures"] > 10
    assert state["failed"] == 0
    assert state["drawn"] == state["figures"], state
    # The two label histograms were collapsed and undrawn until opened.
    assert state["collapsed"] == {"details": 2, "open": 0, "figures": 2, "drawn": 0}
    assert state["drawn_before_opening"] == state["visible_before_opening"] == state["figures"] - 2

    from matplotlib.image import imread

    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    non_white = float((pixels.min(axis=2) < 0.9).mean())
    assert pixels.std() > 0.05, "the screenshot is (nearly) uniform"
    assert non_white > 0.05, f"only {non_white:.1%} of the screenshot is not white"

    # The Setup section is drawn with its tables, provenance and the key of method styles.
    setup = seen["setup"]
    assert setup and setup["visible"] and setup["height"] > 500 and setup["width"] > 1000
    assert {"partition", "partition seed", "model", "rounds", "local work per round", "batch size", "lr",
            "momentum", "clients per round"} <= set(setup["settings"])
    assert setup["methods"] == ["fedavg", "oracle", "prox-lo", "prox-hi"]
    assert setup["provenance"] == ["cflpipe", "torch", "python", "device requested", "device used",
                                   "runs finished", "git commit", "spec hash"]
    assert "unknown (results not in a git checkout)" in setup["text"]
    assert setup["key_drawn"] and setup["key_traces"] == 4
    check_styles(seen["styles"], ["fedavg", "oracle", "prox-lo", "prox-hi"])
    check_legends(seen["legends"])
    check_views(seen["views"], report_page)


def check_views(views: dict, page: Path) -> None:
    """The new sections, as drawn, show what the aggregate next to the page holds."""
    import numpy as np
    import pandas as pd

    aggregate = page.parent.parent / "aggregate"
    curves = pd.read_parquet(aggregate / "curves.parquet")
    clients = pd.read_parquet(aggregate / "final_clients.parquet")
    figures = views["figures"]
    assert all(f["drawn"] and f["width"] > 400 for f in figures), [f["id"] for f in figures if not f["drawn"]]

    def titled(start: str) -> list[dict]:
        return [f for f in figures if f["title"].startswith(start)]

    for scenario in ("swap", "skew"):
        rows = curves[curves["scenario"] == scenario]
        # Training loss: one line per method over every round.
        (loss,) = titled(f"{scenario}: training loss")
        assert loss["section"] == "accuracy"
        lines = {t["name"]: t for t in loss["traces"] if t["type"] == "scatter" and t["y"] and len(t["x"]) == 3}
        assert set(lines) == set(rows["method"])
        for name, t in lines.items():
            want = rows.loc[rows["method"] == name, "train_loss_mean"].to_numpy()
            np.testing.assert_allclose(t["y"], want, rtol=1e-9)
        # Accuracy vs cumulative bytes; the x-axis starts at 0 (or just left of it, for markers).
        (acc_bytes,) = titled(f"{scenario}: personalized accuracy vs bytes sent so far")
        assert acc_bytes["section"] == "communication" and acc_bytes["xrange"][0] <= 0
        assert acc_bytes["xrange"][0] > -0.1 * acc_bytes["xrange"][1]
        for t in acc_bytes["traces"]:
            want = rows.loc[(rows["method"] == t["name"]) & rows["eval"], "bytes_cumulative_mean"].to_numpy() / 1e6
            np.testing.assert_allclose(t["x"], want, rtol=1e-9)
        # Bytes per round start at 0: equal models are not blown up to the plot's full height.
        for direction in ("down", "up"):
            (per_round,) = titled(f"{scenario}: bytes {direction} per round")
            top = max(max(v for v in t["y"] if v is not None) for t in per_round["traces"])
            assert per_round["yrange"][0] <= 0 and per_round["yrange"][1] < 1.5 * top
        # Per-client accuracy: one box per method with one point per client (mean over seeds).
        (boxes,) = titled(f"{scenario}: final accuracy of each client")
        assert boxes["section"] == "clients" and {t["type"] for t in boxes["traces"]} == {"box"}
        for t in boxes["traces"]:
            one = clients[(clients["scenario"] == scenario) & (clients["method"] == t["name"]) & (clients["n"] > 0)]
            np.testing.assert_allclose(sorted(t["x"]), sorted(one.groupby("client")["acc"].mean() * 100), rtol=1e-9)
    # The ranking: a visible table of the three non-reference methods, and why there is no diagram.
    ranking = views["ranking"]
    assert ranking["visible"] and sorted(r[0] for r in ranking["rows"]) == ["fedavg", "prox-hi", "prox-lo"]
    assert all(len(r) == 4 for r in ranking["rows"])  # method, average rank, one cell per scenario
    assert any("no critical-difference diagram is drawn" in n for n in ranking["notes"])
    assert not [f for f in figures if f["section"] == "ranking"]
    # The label histograms, opened by the test, drew at their container's width.
    assert [d["id"] for d in views["labels"]] == ["labels-swap", "labels-skew"] and all(d["open"] for d in views["labels"])
    assert [f["width"] > 400 for f in figures if f["section"] == "overview"] == [True, True]


def test_critical_difference_diagram_renders(built_report_dir, tmp_path, monkeypatch):
    """A ranking the Friedman test rejects (12 scenarios, one order with noise), drawn in Chromium:
    each method's line starts at its average rank, one bar per Nemenyi group, labels inside."""
    import numpy as np
    import pandas as pd

    from cflpipe.report import build
    from cflpipe.report.aggregate import read_aggregate
    from cflpipe.report.ranks import rank_methods
    from cflpipe.report.view import AggregateView

    binary = require_chromium()
    spec = built_report_dir["spec"]
    methods = ["fedavg", "oracle", "prox-lo", "prox-hi"]
    rng = np.random.default_rng(3)
    scores = pd.DataFrame({m: 0.9 - 0.03 * i + 0.02 * rng.standard_normal(12) for i, m in enumerate(methods)},
                          index=[f"s{i}" for i in range(12)])
    want = rank_methods(scores)
    assert want.significant and want.groups and len(want.groups) < len(methods)
    monkeypatch.setattr(AggregateView, "rank_scores", lambda self: (scores, {}))
    html, *_ = build.render_report(spec, read_aggregate(spec))
    page = tmp_path / "cd.html"
    page.write_text(html)
    seen = open_in_browser(binary, page, tmp_path / "profile", tmp_path / "cd.png",
                           {"cd": CD_PROBE, "styles": STYLES_PROBE})
    assert console_problems(seen["events"]) == []
    cd = seen["cd"]
    assert cd and cd["drawn"]
    starts = {t["name"]: t["x"][0] for t in cd["traces"]}
    assert starts == pytest.approx(want.average.to_dict())
    assert all(t["y"][0] == 0 for t in cd["traces"])  # every line starts on the rank axis
    order = want.average
    bars = sorted((order[g[0]] - 0.04, order[g[-1]] + 0.04) for g in want.groups)
    assert [x for bar in sorted(cd["bars"]) for x in bar] == pytest.approx([x for bar in bars for x in bar])
    assert [lab for lab in cd["labels"] if not lab["inside"]] == []
    # The better half labelled on the left ("name (rank)"), the worse half on the right.
    ranked = list(order.sort_values().index)
    assert sorted(lab["text"] for lab in cd["labels"] if "(" in lab["text"]) == sorted(
        [f"{m} ({order[m]:.2f})" for m in ranked[:2]] + [f"({order[m]:.2f}) {m}" for m in ranked[2:]])
    assert any(lab["text"] == f"CD = {want.cd:.2f}" for lab in cd["labels"])
    check_styles(seen["styles"], methods)


# 20 entries: 8 baselines (more than the family's 6 colours), 7 of the seed papers' methods (as
# many as that family's colours, plus one), a reference, personalized and clustered methods.
MANY_METHODS = {
    **{f"fedavg-{i}": {"method": "fedavg"} for i in range(4)},
    **{f"prox-{i}": {"method": "fedprox", "mu": 0.01 * (i + 1)} for i in range(3)},
    "local": {}, "oracle": {"label": "Oracle (true groups)"}, "fedper": {}, "ifca": {"clusters": 2},
    "cfl": {}, **{f"awcfl-b{i}": {"method": "awcfl", "beta": i / 4, "clusters": 2} for i in range(5)},
    "fesem": {"clusters": 2, "init_restarts": 2}, "ifca_mcfl": {"clusters": 2, "label": "IFCA+MCFL"},
    "cfl_awcfl": {"beta": 0.5},
}


@pytest.fixture(scope="module")
def many_methods_page(tmp_path_factory) -> tuple[Path, list[str]]:
    """A one-seed report of 20 method entries on one scenario (3 rounds of 8 digits clients)."""
    from cflpipe.spec import parse_spec

    helpers = _report_helpers()
    root = tmp_path_factory.mktemp("many-methods")
    data = helpers.spec_data(root, seeds=[0], methods=MANY_METHODS)
    data["scenarios"] = {"swap": data["scenarios"]["swap"]}
    return trained_report(parse_spec(data))


def trained_report(spec) -> tuple[Path, list[str]]:
    """Every run of `spec` trained on one torch thread, aggregated and reported: the page and the
    methods' labels."""
    import torch

    from cflpipe.fl.engine import train_run
    from cflpipe.report.aggregate import aggregate
    from cflpipe.report.build import build_report

    from cflpipe.partition_files import partition_scenario

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for scenario in spec.scenarios:  # written, so the page draws the label histograms
            partition_scenario(spec, scenario)
        for scenario, method, seed in spec.matrix():
            train_run(spec, scenario, method, seed, progress=False)
    finally:
        torch.set_num_threads(threads)
    aggregate(spec)
    return build_report(spec), [spec.method_label(m) for m in spec.methods]


def test_many_methods_each_drawn_in_their_own_style(many_methods_page, tmp_path):
    from cflpipe.report.styles import DASHES

    binary = require_chromium()
    page, labels = many_methods_page
    seen = open_in_browser(binary, page, tmp_path / "profile", tmp_path / "many.png", PROBES)
    assert console_problems(seen["events"]) == []
    assert seen["state"]["failed"] == 0 and seen["state"]["drawn"] == seen["state"]["figures"]
    assert len(labels) == 20 and seen["setup"]["key_traces"] == 20
    check_styles(seen["styles"], labels)
    check_legends(seen["legends"])
    # #35 item 4: with 20 methods the headline column is in view; the rest scrolls under the name
    assert seen["wide"] and all(t["first"] == "acc macro %" and t["right"] <= t["width"] for t in seen["wide"])
    assert all(t["kept"] for t in seen["wide"] if t["scrolls"]), seen["wide"]
    # ... and its accuracy curves are one figure per method family, not 20 curves in one
    facets = re.findall(r"personalized accuracy: ([a-z ()]+?) \(mean", page.read_text())
    assert len(set(facets)) >= 3 and "reference and baselines" in facets, facets
    # More baselines than the family has colours: the colour repeats, with another dash.
    lines = {name: next(s for s in found if s[1] is not None)
             for name, found in method_styles(seen["styles"], labels).items()}
    baseline = [lines[n] for n in ("fedavg-0", "fedavg-1", "fedavg-2", "fedavg-3", "prox-0", "prox-1", "prox-2",
                                   "local")]
    assert len({c for c, _, _ in baseline}) == 6 and {d for _, d, _ in baseline} == set(DASHES[:2])
    # One seed: the tables show means without a std (no "nan"), and nothing is marked best.
    text = page.read_text()
    assert not re.search(r"\bnan\b", re.sub(r"<script.*?</script>", "", text, flags=re.S), re.I)
    assert "One seed: no test is possible" in text and 'class="best"' not in text.split('id="comparison"')[1]


def test_missing_chromium_fails_under_ci_and_skips_elsewhere(monkeypatch):
    import sys

    module = sys.modules[__name__]
    monkeypatch.setattr(module, "chromium_binary", lambda: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="no Chromium binary"):
        require_chromium()


# #71 item 6, the page at 1400 px as drawn: how far the glance table and every paper table reach
# (inside main, or they scroll); the style key's category labels and whether its family names
# overlap; the intra/inter scatters' point labels (the lines of each) and the methods with a
# point; every numeric tick's text; the page's text for a "-0.00".
LAYOUT_PROBE = """JSON.stringify((() => {
  const main = document.querySelector('main');
  const inner = main.getBoundingClientRect().right - parseFloat(getComputedStyle(main).paddingRight);
  const reach = t => ({right: t.getBoundingClientRect().right, limit: inner,
                       caption: t.caption ? t.caption.textContent.slice(0, 40) : t.className});
  const key = document.querySelector('#setup div.cfl-fig');
  const boxes = Array.from(key.querySelectorAll('g.annotation')).map(a => a.getBoundingClientRect());
  const overlaps = boxes.some((a, i) => boxes.some((b, j) => j > i && a.left < b.right && b.left < a.right
                                                  && a.top < b.bottom && b.top < a.bottom));
  const scatters = Array.from(document.querySelectorAll('#intra-inter div.cfl-fig')).map(d => ({
    labels: Array.from(d.querySelectorAll('g.textpoint text')).map(t => {
      const lines = t.querySelectorAll('tspan.line');
      return lines.length ? Array.from(lines).map(l => l.textContent) : [t.textContent];
    }),
    points: d._fullData.filter(t => t.mode && t.mode.includes('markers')).map(t => t.name)}));
  const ticks = Array.from(document.querySelectorAll('g.xtick text, g.ytick text, g.y2tick text'))
    .map(t => t.textContent).filter(t => /^[\\u2212\\-]?[0-9]/.test(t));
  return {tables: Array.from(document.querySelectorAll('table.glance, table.paper')).map(reach),
          key_labels: Array.from(key.querySelectorAll('g.ytick text')).map(t => t.textContent),
          key_overlaps: overlaps, scatters: scatters, ticks: ticks,
          negative_zero: /[\\u2212\\-]0\\.0+(?![0-9])/.test(document.body.innerText)};
})())"""


@pytest.fixture(scope="module")
def axes_page(tmp_path_factory) -> tuple[Path, list[str]]:
    """Two seeds of a drift scenario and a new-clients scenario with six identical IFCA entries
    (a six-way tie at the top of "At a glance", six points on one spot) and three methods that
    end as one model (FedAvg, FedProx and CFL that never splits: another shared spot)."""
    from cflpipe.spec import parse_spec

    root = tmp_path_factory.mktemp("axes")
    scenario = {"dataset": "digits", "clients": 12, "hyperparams": {"clusters": 3}}
    spec = parse_spec({
        "seeds": [0, 1], "results_dir": str(root / "results"), "data_dir": str(root / "data"),
        "training": {"model": "mlp", "rounds": 6, "clients_per_round": 9, "local_steps": 5, "batch_size": 32,
                     "lr": 0.05, "eval_every": 3, "trainer": "sequential"},
        "scenarios": {"rot": {**scenario, "partition": [{"kind": "iid"}, {"kind": "rotation", "groups": 3}],
                              "drift": [{"round": 4, "fraction": 0.25}]},
                      "new": {**scenario, "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 3}],
                              "new_clients": 0.25}},
        "methods": {"fedavg": {}, "fedprox": {"mu": 0.01}, "cfl": {},
                    **{f"ifca-{i}": {"method": "ifca", "label": f"IFCA copy {i}"} for i in range(1, 7)},
                    "oracle": {}}})
    return trained_report(spec)


def test_the_page_fits_1400_px_and_says_every_name(axes_page, tmp_path):
    binary = require_chromium()
    page, labels = axes_page
    shot = tmp_path / "axes.png"
    seen = open_in_browser(binary, page, tmp_path / "profile", shot, {"layout": LAYOUT_PROBE, **PROBES})
    assert console_problems(seen["events"]) == [] and seen["state"]["failed"] == 0
    layout = seen["layout"]
    # the glance table (a six-way tie) and every paper table's caption wrap instead of scrolling
    assert [t for t in layout["tables"] if t["right"] > t["limit"] + 1] == [], layout["tables"]
    assert sorted(layout["key_labels"]) == sorted(labels) and not layout["key_overlaps"]
    for scatter in layout["scatters"]:
        named = [name for label in scatter["labels"] for line in label for name in line.split(", ")]
        assert sorted(named) == sorted(scatter["points"]), scatter  # every point named, once
        assert any(len(label) > 1 for label in scatter["labels"])  # six names break onto lines
    assert layout["ticks"] and [t for t in layout["ticks"]
                                if not re.fullmatch(r"[\u2212-]?[0-9][0-9,]*(\.[0-9]+)?%?", t)] == []
    assert not layout["negative_zero"]
    check_legends(seen["legends"])
    glance = (page.parent / "glance.txt").read_text()
    assert "best moved clients' accuracy at the end IFCA copy 1, IFCA copy 2" in glance
    assert "best new clients' accuracy IFCA copy 1" in glance

    from matplotlib.image import imread

    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (HEIGHT, WIDTH) and pixels.std() > 0.05
