"""Apply the best measured schedules: the tuning database as a lookup for ScheduleKernels."""
from __future__ import annotations

import os

from tvm import tirx

from schedules.database import TuningDatabase
from schedules.search_space import Candidate
from schedules.tasks import kernel_key, target_key


class ApplyHistoryBest:
    """The best recorded candidate of each kernel for one target; counts what it served."""

    def __init__(self, db: TuningDatabase | str | os.PathLike, target):
        self.db = db if isinstance(db, TuningDatabase) else TuningDatabase(db)
        self.target = target_key(target)
        self.hits: list[str] = []
        self.misses: list[str] = []

    def lookup(self, func: tirx.PrimFunc, name: str) -> Candidate | None:
        best = self.db.best(kernel_key(func), self.target)
        (self.hits if best is not None else self.misses).append(name)
        return None if best is None else best.candidate["steps"]
