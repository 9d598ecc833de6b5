"""A quiet run says where it is at least every `interval` seconds: workflow jobs train with
`--quiet` (no progress bar), and one round of FCCA or a final evaluation at scale can take minutes,
in which a log that says nothing reads as a hung job. One daemon thread; the run's loop only
sets the round and phase it is in, so nothing of the run's work or bytes depends on it. On stderr:
stdout keeps one line per finished run (the workflow's jobs send both to their log)."""

from __future__ import annotations

import os
import sys
import threading
import time

ENV = "CFLPIPE_HEARTBEAT_SECONDS"
INTERVAL = 30.0


def _seconds(text: str | None) -> float:
    """The environment's interval; anything but a number falls back to the default (a progress
    line is not worth stopping a run for)."""
    try:
        return float(text) if text not in (None, "") else INTERVAL
    except ValueError:
        return INTERVAL


class Heartbeat:
    def __init__(self, name: str, rounds: int, enabled: bool, interval: float | None = None):
        self.name, self.rounds = name, rounds
        self.interval = interval if interval is not None else _seconds(os.environ.get(ENV))
        self.enabled = enabled and 0 < self.interval < 1e6
        self.round, self.phase = 0, "starting"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()

    def at(self, round_number: int, phase: str) -> None:
        """The run is now in `phase` of round `round_number` (1-based)."""
        self.round, self.phase = round_number, phase

    def __enter__(self) -> "Heartbeat":
        if self.enabled:
            self._thread = threading.Thread(target=self._beat, name="cflpipe-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            elapsed = time.monotonic() - self._started
            print(f"{self.name}: round {self.round} of {self.rounds}, {self.phase} ({elapsed:.0f} s)", file=sys.stderr,
                  flush=True)
