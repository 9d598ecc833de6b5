"""Average ranks of methods over scenarios, the Friedman test and the Nemenyi critical difference
(Demšar, "Statistical comparisons of classifiers over multiple data sets", JMLR 7, 2006).

Scenarios play Demšar's data sets: in each scenario the methods are ranked by their mean over
seeds of one figure (rank 1 the best, tied means share the average of their ranks), and the
ranks are averaged over scenarios. The Friedman test (scipy.stats.friedmanchisquare, with its
correction for ties) asks whether all methods rank alike; only when it rejects that at α does
the Nemenyi post-hoc test say which pairs differ: two methods differ when their average ranks
differ by at least the critical difference

    CD = q_α · sqrt(k (k + 1) / (6 N)),   q_α = studentized range quantile(1 − α; k, ∞) / √2,

for k methods and N scenarios. The test needs a complete design, so only methods that ran on
every scenario are ranked; the rest are listed with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

ALPHA = 0.05
# Demšar's rule of thumb: below these the χ² approximation of the Friedman statistic is rough.
FRIEDMAN_RELIABLE_N, FRIEDMAN_RELIABLE_K = 10, 5


def rank_scores(scores: pd.DataFrame, higher_is_better: bool = True) -> pd.DataFrame:
    """Ranks within each row (scenario) of a scenarios × methods table: 1 = best, ties averaged."""
    from scipy.stats import rankdata

    if scores.isna().to_numpy().any():
        raise ValueError("rank_scores: the scores table has missing values (the design must be complete)")
    values = scores.to_numpy(dtype="float64")
    ranks = rankdata(-values if higher_is_better else values, method="average", axis=1)
    return pd.DataFrame(ranks, index=scores.index, columns=scores.columns)


def q_alpha(k: int, alpha: float = ALPHA) -> float:
    """Nemenyi's critical value for k methods: the studentized range quantile over √2."""
    from scipy.stats import studentized_range

    if k < 2:
        raise ValueError(f"q_alpha: needs at least 2 methods, got {k}")
    return float(studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2))


def critical_difference(k: int, n: int, alpha: float = ALPHA) -> float:
    """Nemenyi's CD for k methods ranked on n scenarios."""
    if n < 1:
        raise ValueError(f"critical_difference: needs at least 1 scenario, got {n}")
    return q_alpha(k, alpha) * math.sqrt(k * (k + 1) / (6 * n))


def friedman(scores: pd.DataFrame) -> tuple[float, float]:
    """Friedman's χ² statistic and p-value over the rows (scenarios) of a scenarios × methods table;
    (nan, nan) when every scenario ties all methods (the statistic is 0/0)."""
    from scipy.stats import friedmanchisquare

    ranks = rank_scores(scores)
    if (ranks.nunique(axis=1) == 1).all():
        return math.nan, math.nan
    result = friedmanchisquare(*(scores[c].to_numpy(dtype="float64") for c in scores.columns))
    return float(result.statistic), float(result.pvalue)


def nemenyi_groups(average: pd.Series, cd: float) -> list[list[str]]:
    """Maximal runs of methods (sorted by average rank) whose ranks differ by less than `cd`: the
    groups a CD diagram joins with a bar (no two methods of a group differ significantly).
    Singletons are left out; groups come in rank order."""
    order = average.sort_values(kind="stable")
    names, values = list(order.index), order.to_numpy(dtype="float64")
    groups: list[list[str]] = []
    reach = -1
    for i in range(len(values)):
        j = i
        while j + 1 < len(values) and values[j + 1] - values[i] < cd:
            j += 1
        if j > i and j > reach:  # not inside the group an earlier method already starts
            groups.append(names[i:j + 1])
            reach = j
    return groups


@dataclass
class Ranking:
    """What the report's ranking section shows; `notes` say what could not be computed and why."""
    figure: str
    scenarios: list[str]
    methods: list[str]                      # ranked methods, in the caller's order
    scores: pd.DataFrame                    # scenarios × methods, mean over seeds
    ranks: pd.DataFrame                     # scenarios × methods, 1 = best
    average: pd.Series                      # method → average rank over scenarios
    excluded: dict[str, str] = field(default_factory=dict)  # method → why it is not ranked
    statistic: float = math.nan             # Friedman χ²
    p_value: float = math.nan
    cd: float | None = None                 # drawn only after the Friedman test rejects
    groups: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    alpha: float = ALPHA

    @property
    def tested(self) -> bool:
        return math.isfinite(self.p_value)

    @property
    def significant(self) -> bool:
        return self.tested and self.p_value < self.alpha


def rank_methods(scores: pd.DataFrame, excluded: dict[str, str] | None = None, figure: str = "acc_macro",
                 alpha: float = ALPHA, higher_is_better: bool = True) -> Ranking | None:
    """The ranking of the methods (columns) of a scenarios × methods table of means; methods with a
    missing value in some scenario are dropped into `excluded`. None when fewer than two methods
    or no scenario remain."""
    excluded = dict(excluded or {})
    for m in scores.columns:
        if m in excluded:
            continue
        missing = [str(s) for s in scores.index if not math.isfinite(float(scores.loc[s, m]))]
        if missing:
            excluded[m] = f"no result on {', '.join(missing)}"
    complete = scores.loc[:, [m for m in scores.columns if m not in excluded]]
    k, n = complete.shape[1], complete.shape[0]
    if k < 2 or n < 1:
        return None
    ranks = rank_scores(complete, higher_is_better)
    ranking = Ranking(figure, list(complete.index), list(complete.columns), complete, ranks, ranks.mean(axis=0),
                      excluded, alpha=alpha)
    if k < 3 or n < 2:
        ranking.notes.append(f"The Friedman test needs at least 3 methods and 2 scenarios (here {k} methods on "
                             f"{n} scenario{'s' if n != 1 else ''}): the ranks are shown, no test is possible, "
                             f"and no critical-difference diagram is drawn.")
        return ranking
    # The statistic depends on the ranks' spread only, so the direction does not matter here.
    ranking.statistic, ranking.p_value = friedman(complete)
    if not ranking.tested:
        ranking.notes.append("Every scenario ties all methods: there is nothing to test.")
        return ranking
    if n <= FRIEDMAN_RELIABLE_N or k <= FRIEDMAN_RELIABLE_K:
        ranking.notes.append(f"With {n} scenarios and {k} methods the χ² approximation of the Friedman "
                             f"statistic is rough (Demšar's rule of thumb asks for N > {FRIEDMAN_RELIABLE_N} "
                             f"and k > {FRIEDMAN_RELIABLE_K}): read p as a guide.")
    if not ranking.significant:
        ranking.notes.append(f"The Friedman test does not reject that all methods rank alike (p = "
                             f"{ranking.p_value:.3g} ≥ α = {alpha:g}), so no post-hoc test is made and no "
                             f"critical-difference diagram is drawn"
                             + (f"; with only {n} scenarios a difference must be large to show" if n < 5 else "")
                             + ".")
        return ranking
    ranking.cd = critical_difference(k, n, alpha)
    ranking.groups = nemenyi_groups(ranking.average, ranking.cd)
    return ranking


__all__ = ["ALPHA", "Ranking", "critical_difference", "friedman", "nemenyi_groups", "q_alpha", "rank_methods",
           "rank_scores"]
