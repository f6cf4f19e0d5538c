"""The best measured schedules: the tuning database as a lookup for ScheduleKernels.

A candidate's time is the median of every time recorded for it (a candidate the tuner
measured again, to check it, has several records): one lucky measurement does not make a
schedule the best, which the minimum over single records would let happen.
"""
from __future__ import annotations

import math
import os
import statistics

from tvm import tirx

from schedules.database import TuningDatabase, TuningRecord
from schedules.search_space import Candidate, candidate_key
from schedules.tasks import kernel_key, target_key


def pooled_times(records: list[TuningRecord]) -> dict[str, tuple[Candidate, float]]:
    """candidate key -> (candidate, median of all its recorded times); failures left out."""
    times: dict[str, list[float]] = {}
    cands: dict[str, Candidate] = {}
    for r in records:
        if r.ok and r.times_ms:
            key = candidate_key(r.candidate["steps"])
            times.setdefault(key, []).extend(r.times_ms)
            cands[key] = r.candidate["steps"]
    return {k: (cands[k], statistics.median(v)) for k, v in times.items()}


def pooled_best(records: list[TuningRecord]) -> tuple[Candidate, float] | None:
    """The candidate with the lowest pooled median, or None."""
    pooled = pooled_times(records)
    return min(pooled.values(), key=lambda cm: cm[1], default=None)


def pooled_ms(records: list[TuningRecord], candidate: Candidate) -> float:
    entry = pooled_times(records).get(candidate_key(candidate))
    return entry[1] if entry else math.inf


class ApplyHistoryBest:
    """The best recorded candidate of each kernel for one target."""

    def __init__(self, db: TuningDatabase | str | os.PathLike, target):
        self.db = db if isinstance(db, TuningDatabase) else TuningDatabase(db)
        self.target = target_key(target)

    def lookup(self, func: tirx.PrimFunc) -> Candidate | None:
        best = pooled_best(self.db.records(kernel_key(func), self.target))
        return None if best is None else best[0]
