"""Tuning's records and selection. Each trial run leaves `trial.json` beside its outputs: its
validation curve and nothing of its test figures, so a selection cannot read test data. The
selection of a tuned method entry on a scenario reads those records only and writes its chosen
file (Spec.chosen_path), which the final runs read (Spec.with_tuning_choices). No torch here."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cflpipe import store
from cflpipe.errors import CflpipeError, DataError
from cflpipe.spec import Spec

TRIAL_FILE = "trial.json"
# The figure trials are compared by: validation data only.
SELECTED_ON = "val_acc_macro"


def trial_file(spec: Spec, scenario: str, method: str, trial: str, seed: int) -> Path:
    return spec.tuning_spec().run_dir(scenario, spec.trial_entry(method, trial), seed) / TRIAL_FILE


def record_trial(spec: Spec, scenario: str, method: str, trial: str, seed: int,
                 failure: CflpipeError | None = None) -> Path:
    """Write a finished (or diverged) trial run's record from its rounds.parquet: the
    validation accuracy and loss of its full evaluations, never a test column."""
    view, entry = spec.tuning_spec(), spec.trial_entry(method, trial)
    values = next(t.values for t in spec.trials(method) if t.name == trial)
    record: dict[str, Any] = {"scenario": scenario, "method": method, "trial": trial, "seed": seed,
                              "values": values}
    if failure is not None:
        record.update(status="diverged", error=str(failure).splitlines()[0])
    else:
        rounds = store.read_parquet(view.run_dir(scenario, entry, seed) / "rounds.parquet")
        training = view.resolved_training(scenario, entry)
        rows = rounds[rounds[SELECTED_ON].notna()]
        rows = rows[[training.is_full_evaluation(int(r)) for r in rows["round"]]]
        record.update(status="finished", rounds=[int(r) for r in rows["round"]],
                      val_acc_macro=[float(v) for v in rows[SELECTED_ON]],
                      val_loss=[float(v) for v in rows["val_loss"]], last_round=training.rounds)
    path = trial_file(spec, scenario, method, trial, seed)
    store.write_json(path, record)
    return path


@dataclass(frozen=True)
class TrialScore:
    trial: str
    values: dict[str, Any]
    per_seed: dict[int, float | None]  # None: the seed's run diverged or scored NaN

    @property
    def score(self) -> float | None:
        """Mean over tuning seeds; None when any seed has no score (a trial that diverged on one
        seed is not one to pick)."""
        scores = list(self.per_seed.values())
        if not scores or any(s is None for s in scores):
            return None
        return sum(scores) / len(scores)  # type: ignore[arg-type]

    @property
    def std(self) -> float | None:
        if self.score is None or len(self.per_seed) < 2:
            return None
        mean = self.score
        return math.sqrt(sum((s - mean) ** 2 for s in self.per_seed.values()) / (len(self.per_seed) - 1))  # type: ignore[operator]


def read_trial(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or record.get("status") not in ("finished", "diverged"):
            raise ValueError("no status finished or diverged")
        return record
    except FileNotFoundError:
        raise DataError(f"{path}: missing; train the trial first (`cflpipe tune`, which snakemake runs)") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a trial record ({exc}); delete it and run `cflpipe tune` again") from None


def seed_score(record: dict[str, Any], rule: str) -> float | None:
    """One trial run's score under the selection rule: its validation accuracy at the last round
    (`last`) or at its best full evaluation (`best`)."""
    if record["status"] != "finished" or not record["val_acc_macro"]:
        return None
    values = record["val_acc_macro"]
    if rule == "last":
        if record["rounds"][-1] != record["last_round"]:
            return None
        value = values[-1]
    else:
        finite = [v for v in values if v == v]
        value = max(finite) if finite else math.nan
    return None if value != value else float(value)


def trial_scores(spec: Spec, scenario: str, method: str) -> list[TrialScore]:
    """Every trial of a tuned method entry on a scenario, scored from its records."""
    assert spec.tuning is not None
    scores = []
    for trial in spec.trials(method):
        files = {seed: trial_file(spec, scenario, method, trial.name, seed) for seed in spec.tuning.seeds}
        records = {seed: read_trial(path) for seed, path in files.items()}
        for seed, record in records.items():
            if record.get("values") != trial.values:
                raise DataError(f"{files[seed]}: records values {record.get('values')}, "
                                f"not the trial's {trial.values}; run `cflpipe tune` again")
        scores.append(TrialScore(trial.name, trial.values,
                                 {seed: seed_score(r, spec.tuning.select) for seed, r in records.items()}))
    return scores


def select(spec: Spec, scenario: str, method: str) -> dict[str, Any]:
    """Pick the trial with the highest score (the first of equal ones, in the space's order) and
    write the chosen file; returns what it wrote."""
    assert spec.tuning is not None
    scores = trial_scores(spec, scenario, method)
    scored = [s for s in scores if s.score is not None]
    if not scored:
        raise DataError(f"tuning of methods.{method} on {scenario}: every trial diverged or has no validation score "
                        f"at its {'last' if spec.tuning.select == 'last' else 'best'} round; see "
                        f"{spec.tuning_dir / 'runs' / scenario / method}/*/seed*/{TRIAL_FILE}")
    best = max(scored, key=lambda s: s.score)  # max keeps the first of equal scores
    chosen = {
        "scenario": scenario, "method": method, "chosen": best.trial, "values": best.values,
        "selected_on": SELECTED_ON, "rule": spec.tuning.select, "tuning_seeds": list(spec.tuning.seeds),
        "sampler": spec.tuning.sampler,
        "trials": [{"trial": s.trial, "values": s.values, "score": s.score, "std": s.std,
                    "per_seed": {str(k): v for k, v in s.per_seed.items()}} for s in scores],
    }
    store.write_json(spec.chosen_path(scenario, method), chosen)
    return chosen
