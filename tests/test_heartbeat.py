"""A quiet run (workflow jobs) says which round and phase it is in at least every interval."""

from __future__ import annotations

import io
import re
import sys
import time

from cflpipe.fl.heartbeat import Heartbeat
from cflpipe.fl.engine import train_run
from cflpipe.spec import parse_spec


def test_a_run_without_a_bar_on_a_terminal_says_its_round_and_phase(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CFLPIPE_HEARTBEAT_SECONDS", "0.002")
    spec = parse_spec({"seeds": [0], "results_dir": str(tmp_path),
                       "training": {"model": "mlp", "rounds": 3, "clients_per_round": 4, "local_steps": 5,
                                    "eval_every": 1, "device": "cpu", "trainer": "sequential"},
                       "scenarios": {"s": {"dataset": "digits", "clients": 4}}, "methods": {"fedavg": {}}})
    train_run(spec, "s", "fedavg", 0, progress=False)
    out = capsys.readouterr()
    assert "of 3," not in out.out  # stdout keeps the finished-run lines alone
    lines = [line for line in out.err.splitlines() if "round" in line]
    beats = [re.match(r".*s/fedavg/seed0: round (\d) of 3, (starting|training|server|evaluating|saving its "
                      r"checkpoint|writing its outputs) \(\d+ s\)$", line) for line in lines]
    assert beats and all(beats), lines
    assert {int(b.group(1)) for b in beats} <= {0, 1, 2, 3}
    # a bar run whose stderr is no terminal (`cflpipe train … 2> log`) draws no bar: it beats too
    train_run(spec, "s", "fedavg", 0, progress=True, force=True)
    assert "s/fedavg/seed0: round" in capsys.readouterr().err

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    train_run(spec, "s", "fedavg", 0, progress=True, force=True)
    assert "of 3," not in terminal.getvalue() and "round/s" in terminal.getvalue()  # the bar alone


def test_the_beat_stops_with_the_run_and_is_off_at_zero(capsys):
    with Heartbeat("run", 5, enabled=True, interval=0.01) as beat:
        beat.at(2, "training")
        time.sleep(0.05)
    out = capsys.readouterr().err
    assert "run: round 2 of 5, training" in out
    time.sleep(0.05)
    assert capsys.readouterr().err == ""  # nothing after the run
    with Heartbeat("run", 5, enabled=True, interval=0) as beat:
        time.sleep(0.02)
    assert capsys.readouterr().err == "" and beat._thread is None
