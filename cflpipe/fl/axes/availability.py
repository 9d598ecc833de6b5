"""Clients that go away (scenario `availability`): a seeded share of the clients is unavailable
for stretches of rounds, as cross-device clients are (a phone off its charger, out of its network).
While away a client is never sampled; when it comes back it meets whatever the method kept for it
(its cluster, its own model, or nothing but the global one) and trains again when next sampled.

Settings: `share` of the clients with training samples go away (a seeded choice by the run's
seed, at least one), each for `stretches` stretches of `away` rounds. The stretches are placed
by the same seed: each starts after a round the client was present in, consecutive ones are at
least a round apart, and the last ends before the run does, so every stretch has a return.
Every method of a run seed meets the same schedule.

What a run reports (summary.json's `availability`, availability.parquet), per stretch: the
accuracy the client was served after the last round before it left (`acc_before`), what it is
served when it comes back (after the stretch's last round: `acc_on_return`), and the rounds
trained after its return until it is served at least as well as before (`rounds_to_recover`, 0
when the model it returns to already serves it as well; null when it never is before its next
stretch or the run's end). The axis evaluates only the clients it follows, after the rounds it
needs (the run's own evaluations read what they read without it; a method whose evaluation keeps
a choice, IFCA's cluster by loss, keeps the followed clients' latest); "served" is the model the
method serves the client, on its own test split, as acc_macro's. A run that reads no test split
(tuning's trials) keeps the clients away and follows none. Over the stretches: returning_acc_before,
returning_acc, rounds_to_recover (the mean over those that recovered) and returning_recovered
(the share that did).

A method's server-side questions (`Context.ask`) are not stopped for an away client: a method
that asks every client between rounds still hears from it. The share of clients a round samples
is drawn from those present; where fewer are present than `clients_per_round`, the round samples
every present client."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cflpipe.fl.axes import Axis, plain
from cflpipe.seeds import rng

_SCHEDULE = 0xA7A1  # purpose of the seeded draws: who goes away, and when


class AvailabilitySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    share: float = Field(gt=0, lt=1, description="share of the clients (with training samples) that go away; "
                                                 "at least one")
    away: int = Field(ge=1, le=1_000_000, description="rounds each stretch away lasts")
    stretches: int = Field(1, ge=1, le=1000, description="stretches away of each such client, at least a round "
                                                         "apart, each with its return before the run ends")

    def rounds_needed(self) -> int:
        """The fewest rounds a run needs: a round present before each stretch, one between
        stretches, and a round after the last to come back in."""
        return self.stretches * (self.away + 1) + 1


def schedule(settings: AvailabilitySettings, candidates: np.ndarray, rounds: int, seed: int) -> np.ndarray:
    """The stretches as rows (client, start, end): 1-based rounds away, inclusive, sorted by
    client then start. A seeded choice of max(1, round(share · n)) of `candidates`, at most n − 1
    (one stays); each one's
    stretches placed uniformly among the placements the rules allow (stars and bars over the
    spare rounds)."""
    draw = rng(seed, _SCHEDULE)
    # at least one client stays: a round with every client away would train nothing
    count = min(len(candidates) - 1, max(1, round(settings.share * len(candidates))))
    who = np.sort(draw.choice(candidates, size=count, replace=False))
    k, away = settings.stretches, settings.away
    spare = rounds - settings.rounds_needed()
    rows = []
    for client in who:
        slots = np.sort(draw.choice(spare + k, size=k, replace=False))
        for i, slot in enumerate(slots):
            start = 2 + int(slot) - i + i * (away + 1)
            rows.append((int(client), start, start + away - 1))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def recovery(rows: dict[str, list], stretches: int) -> tuple[np.ndarray, np.ndarray]:
    """From the axis's rows so far, per stretch: the accuracy before it (NaN: not yet recorded)
    and the rounds trained after its return until its client was served at least as well (−1:
    not yet)."""
    phase = np.asarray(rows.get("phase", []), dtype=object)
    index = np.asarray(rows.get("stretch", []), dtype=np.int64)
    acc = np.asarray(rows.get("acc", []), dtype=float)
    since = np.asarray(rows.get("since_return", []), dtype=np.int64)
    stretches = max(stretches, int(index.max()) + 1 if len(index) else 0)
    before = np.full(stretches, np.nan)
    first = phase == "before"
    before[index[first]] = acc[first]
    recovered = np.full(stretches, -1, dtype=np.int64)
    back = ~first
    hit = back & (acc >= before[index])
    # rows come in round order: the first hit of each stretch is its smallest rounds-since-return
    for stretch, rounds in zip(index[hit][::-1], since[hit][::-1]):
        recovered[stretch] = rounds
    return before, recovered


def recovered_after(rows: dict[str, list], stretch: int) -> int | None:
    """Rounds trained after stretch `stretch`'s return until its client was served at least as
    well as before it left, from the axis's rows so far; None: not yet."""
    found = int(recovery(rows, stretch + 1)[1][stretch])
    return None if found < 0 else found


class Availability(Axis):
    """Clients away for stretches of rounds, never sampled while away; what each method serves
    them when they come back, and how soon it serves them as well as before."""

    name = key = "availability"
    title = "clients that go away"  # the report's setup row
    Settings = AvailabilitySettings
    # summary.json's figures over the stretches, into runs.parquet and summary.parquet
    figures = ("returning_acc_before", "returning_acc", "rounds_to_recover", "returning_recovered")
    # report tables: (name, title, figure, scale, digits, direction)
    tables = (
        ("returning_acc", "Clients that go away: personalized accuracy (%) of what each method serves them when they "
                          "come back", "returning_acc", 100.0, 1, 1),
        # no best: the mean is over the stretches that recovered, which a method may have few of
        ("rounds_to_recover", "Clients that go away: rounds trained after their return until served as well as "
                              "before they left (mean over those that were)", "rounds_to_recover", 1.0, 1, 0),
        ("returning_recovered", "Clients that go away: share served as well as before they left, by their next "
                                "stretch or the run's end", "returning_recovered", 1.0, 2, 1),
    )

    def __init__(self, settings: AvailabilitySettings):
        self.settings = settings

    @classmethod
    def check(cls, settings: AvailabilitySettings, where: str, rounds: int, rounds_where: str,
              clients: int) -> list[str]:
        """validate's lines for a run of `rounds` rounds over `clients` participants."""
        if clients < 2:
            return [f"{where}: keeps clients away while others train, and the scenario has {clients} participant; "
                    f"allowed: 2 or more clients"]
        needed = settings.rounds_needed()
        if rounds >= needed:
            return []
        stretches = "1 stretch" if settings.stretches == 1 else f"{settings.stretches} stretches"
        most, fit = (rounds - 1) // settings.stretches - 1, (rounds - 1) // (settings.away + 1)
        allowed = [*([f"away <= {most} at {stretches}"] if most >= 1 else []),
                   *([f"stretches <= {fit} at away {settings.away}"] if 1 <= fit < settings.stretches else [])]
        return [f"{where}.away: {stretches} of {settings.away} rounds need at least {needed} rounds (a round present "
                f"before each, one between them, one to come back in), and {rounds_where}.rounds is {rounds}; "
                f"allowed: {' or '.join(allowed) or f'{needed} rounds or more'}"]

    @classmethod
    def describe(cls, settings: AvailabilitySettings, clients: int) -> str:
        count = min(clients - 1, max(1, round(settings.share * clients)))
        times = "once" if settings.stretches == 1 else f"{settings.stretches} times"
        return (f"{count} of {clients} clients away {times} for {settings.away} rounds (seeded per run seed; of "
                f"those with training and test samples)")

    # ------------------------------------------------------------------ a run

    def prepare(self, run) -> None:
        # a client without a test split has no accuracy to follow
        candidates = np.flatnonzero((run.data.train.sizes() > 0) & (run.data.test.sizes() > 0))
        self.rows = schedule(self.settings, candidates, run.training.rounds, run.seed)
        # a run that reads no test split (tuning's trials) keeps the clients away and follows none
        self.follows = run.training.eval_test
        # the next stretch of the same client: this one is followed up to the round before it
        # (after which the next one's "before" is read too), the last up to the run's last round
        self.next_start = np.full(len(self.rows), run.training.rounds + 1)
        for i in range(len(self.rows) - 1):
            if self.rows[i + 1, 0] == self.rows[i, 0]:
                self.next_start[i] = self.rows[i + 1, 1]

    def away(self, round_number: int) -> np.ndarray:
        here = (self.rows[:, 1] <= round_number) & (round_number <= self.rows[:, 2])
        return np.unique(self.rows[here, 0])

    def after_round(self, run, round_number: int) -> None:
        if not self.follows:
            return
        table = run.tables.setdefault(self.name, defaultdict(list))
        starts, ends = self.rows[:, 1], self.rows[:, 2]
        before = np.flatnonzero(starts - 1 == round_number)
        following = (ends <= round_number) & (round_number < self.next_start)
        if following.any():  # once served as well as before, a stretch is followed no further
            following &= (ends == round_number) | (recovery(table, len(self.rows))[1] < 0)
        wanted = [(int(i), "before") for i in before] + [(int(i), "back") for i in np.flatnonzero(following)]
        if not wanted:
            return
        clients = np.unique([self.rows[i, 0] for i, _ in wanted])
        acc = dict(zip(clients.tolist(), run.served_accuracy(clients, round_number)))
        run.extend(self.name, {
            "round": [round_number] * len(wanted),
            "client": [int(self.rows[i, 0]) for i, _ in wanted],
            "stretch": [i for i, _ in wanted],
            "phase": [phase for _, phase in wanted],
            "since_return": [round_number - int(ends[i]) if phase == "back" else -1 for i, phase in wanted],
            "acc": [acc[int(self.rows[i, 0])] for i, _ in wanted]})

    def summary(self, run) -> dict[str, Any]:
        if not self.follows:
            return {}
        table = run.tables.get(self.name, {})
        index = np.asarray(table.get("stretch", []), dtype=np.int64)
        on_return = np.full(len(self.rows), np.nan)
        at_end = (np.asarray(table.get("since_return", []), dtype=np.int64) == 0)
        on_return[index[at_end]] = np.asarray(table.get("acc", []), dtype=float)[at_end]
        before, recovered = recovery(table, len(self.rows))
        stretches = [{"client": int(client), "start": int(start), "back": int(end) + 1,
                      "acc_before": plain(before[i]), "acc_on_return": plain(on_return[i]),
                      "rounds_to_recover": None if recovered[i] < 0 else int(recovered[i])}
                     for i, (client, start, end) in enumerate(self.rows)]
        recovered = [s["rounds_to_recover"] for s in stretches if s["rounds_to_recover"] is not None]
        followed = [s for s in stretches if s["acc_on_return"] is not None]
        return {self.name: {
            "returning_acc_before": _mean([s["acc_before"] for s in stretches]),
            "returning_acc": _mean([s["acc_on_return"] for s in stretches]),
            "rounds_to_recover": _mean(recovered),
            "returning_recovered": len(recovered) / len(followed) if followed else None,
            "stretches": stretches}}


def _mean(values: list) -> float | None:
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else None
