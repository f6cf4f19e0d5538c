"""The best measured schedules: the tuning database as a lookup for ScheduleKernels.

A candidate's time is the median of every time recorded for it in its steady records (a
candidate the tuner measured again, to check it, has several records): one lucky
measurement does not make a schedule the best, which the minimum over single records would
let happen. A record whose repeats spread by more than ``NOISY`` was taken while something
else held the machine (one here had a median 20x the candidate's steady time): the tuner
measures such a candidate again, and that record then counts no more.
"""
from __future__ import annotations

import math
import os
import statistics
import warnings

import tvm
import tvm_ffi
from tvm import tirx

from tvm_ext.machine import Machine

from schedules.database import TuningDatabase, TuningRecord
from schedules.search_space import Candidate, candidate_key
from schedules.tasks import kernel_key, target_key


#: A record whose repeats spread by more than this ((max - min) / median) is noisy.
NOISY = 0.2


def spread_of(times: list[float]) -> float:
    """(max - min) / median: how far a candidate's repeated times disagree."""
    med = statistics.median(times)
    return (max(times) - min(times)) / med if med > 0 else 0.0


def steady(records: list[TuningRecord], bound: float = NOISY) -> list[TuningRecord]:
    """The successful records that count: of each candidate of each task, those whose repeats
    spread by at most ``bound``, or all of its records when none does."""
    by_key: dict[tuple[str, str], list[TuningRecord]] = {}
    for r in records:
        if r.ok and r.times_ms:
            by_key.setdefault((r.task, candidate_key(r.candidate["steps"])), []).append(r)
    out = []
    for rs in by_key.values():
        kept = [r for r in rs if spread_of(r.times_ms) <= bound]
        out += kept or rs
    return out


def recorded_times(records: list[TuningRecord]) -> dict[str, tuple[Candidate, list[float]]]:
    """candidate key -> (candidate, every time of its steady records (``steady``)); failures left out."""
    out: dict[str, tuple[Candidate, list[float]]] = {}
    for r in steady(records):
        out.setdefault(candidate_key(r.candidate["steps"]), (r.candidate["steps"], []))[1].extend(r.times_ms)
    return out


def pooled_times(records: list[TuningRecord]) -> dict[str, tuple[Candidate, float]]:
    """candidate key -> (candidate, median of its steady recorded times); failures left out."""
    return {k: (c, statistics.median(t)) for k, (c, t) in recorded_times(records).items()}


def pooled_best(records: list[TuningRecord]) -> tuple[Candidate, float] | None:
    """The candidate with the lowest pooled median, or None."""
    pooled = pooled_times(records)
    return min(pooled.values(), key=lambda cm: cm[1], default=None)


def pooled_ms(records: list[TuningRecord], candidate: Candidate) -> float:
    entry = pooled_times(records).get(candidate_key(candidate))
    return entry[1] if entry else math.inf


class ApplyHistoryBest:
    """The best recorded candidate of each kernel for one target, from records measured on a
    matching machine only (``TuningRecord.matches``); the others are counted in ``skipped``
    and named in one warning per machine they came from."""

    def __init__(self, db: TuningDatabase | str | os.PathLike, target):
        self.db = db if isinstance(db, TuningDatabase) else TuningDatabase(db)
        self.target = target_key(target)
        self.machine = Machine.for_target(tvm.target.Target(self.target))
        self.skipped: dict[str, int] = {}  # where the records were measured -> how many were left out

    #: How much faster than the untuned schedule a record must be to replace it: the repeats of
    #: one kernel spread by ~6% here, so a smaller lead is as likely noise as speed.
    margin = 0.03

    def lookup(self, func: tirx.PrimFunc, untuned: Candidate | None = None) -> Candidate | None:
        """The best record's candidate; None when there is none, or when ``untuned`` (the
        heuristic's choice) was measured too and the best is not ``margin`` faster than it."""
        mine = []
        for r in self.db.records(kernel_key(func)):
            if r.target == self.target and r.matches(self.machine):
                mine.append(r)
                continue
            if r.measured_on not in self.skipped:
                warnings.warn(f"tuning database {self.db.path}: records measured on {r.measured_on} are not "
                              f"applied here ({self.machine.cpu or 'this CPU'}, {self.machine.vector_bits}-bit "
                              f"vectors, target {self.target}): tune on this machine to use the database here",
                              stacklevel=2)
            self.skipped[r.measured_on] = self.skipped.get(r.measured_on, 0) + 1
        best = pooled_best(mine)
        if best is None:
            return None
        if untuned is not None and best[1] > (1 - self.margin) * pooled_ms(mine, untuned):
            return None
        return best[0]


# --------------------------------------------------------------------------- the model check
#: ``tune`` times the whole model built with the database against the model built without
#: it, as users call it, and keeps both times as records of the task ``model:<fusion>:<hash>``.
TUNED, UNTUNED = {"model": "tuned"}, {"model": "untuned"}


def model_check_task(mod: tvm.IRModule, fusion: str) -> str:
    """The task key of a model's check: its imported module and the fusion strategy."""
    return f"model:{fusion}:{tvm_ffi.structural_hash(mod) & (2 ** 64 - 1):016x}"


def model_check(db: TuningDatabase, task: str, target, machine: Machine) -> tuple[float, float] | None:
    """(tuned ms, untuned ms) of the latest check of ``task`` measured on this machine, or None."""
    latest: dict[str, TuningRecord] = {}
    for r in db.records(task, target_key(target)):
        side = r.candidate.get("model")
        if r.ok and r.matches(machine) and side in ("tuned", "untuned"):
            if side not in latest or r.timestamp >= latest[side].timestamp:
                latest[side] = r
    if len(latest) < 2:
        return None
    return latest["tuned"].median_ms, latest["untuned"].median_ms
