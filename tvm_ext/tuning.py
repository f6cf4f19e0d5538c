"""``tune(model, ...)``: measure schedules for a model's kernels and record them.

    summary = tvm_ext.tune(model, trials=200, db="tuning.jsonl")
    print(summary.table())
    compiled = tvm_ext.compile(model, tuning_db="tuning.jsonl")   # no measurement

The model goes through the same import and fusion as ``compile``; its kernels become the
tasks (``schedules.tasks``), which ``schedules.tuner.Tuner`` tunes with the XGBoost cost
model, measuring with a local or RPC runner (``schedules.measure``).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from schedules.database import TuningDatabase
from schedules.measure import LocalBuilder, LocalRunner, MeasureInput, Runner, measure
from schedules.tasks import Task, extract_tasks
from schedules.tuner import TuneOptions, Tuner, TuneSummary
from tvm_ext.frontends import import_model
from tvm_ext.pipeline import Pipeline


#: How the tuner times a candidate: each of 5 repeats runs the kernel for at least 10 ms
#: (a 20 us kernel ~500 times), so one scheduler hiccup does not make a schedule look good.
TUNING_TIMING = {"number": 3, "repeat": 5, "warmup": 1, "min_repeat_ms": 10}


class KernelMeasurer:
    """Builds candidates in parallel processes and times them with ``runner``."""

    def __init__(self, builder: LocalBuilder | None = None, runner: Runner | None = None):
        self.builder = builder or LocalBuilder()
        self.runner = runner or LocalRunner(**TUNING_TIMING)
        self._owned = [part for part, given in ((self.builder, builder), (self.runner, runner)) if given is None]

    def __call__(self, task: Task, results: list) -> list[tuple[list[float], str | None]]:
        inputs = [MeasureInput(f"{task.name}#{i}", r.func, task.target) for i, r in enumerate(results)]
        return [(m.times_ms, m.error) for m in measure(inputs, self.builder, self.runner)]

    def close(self) -> None:
        """Stop the worker processes this measurer started (and delete the built libraries)."""
        for part in self._owned:
            part.close()


def tasks_of(model: Any, example_inputs: Sequence[Any] | None = None, *, target: Any = None,
             fusion: Any = "autofuse", shape_dict: dict | None = None, rollback: str = "count",
             db: TuningDatabase | None = None, progress: Callable[[str], None] | None = None) -> list[Task]:
    """The tuning tasks of a model, as ``compile`` with the same arguments would build them
    (``rollback``, ``db``: see ``compile``'s ``rollback`` and ``tuning_db``)."""
    pipeline = Pipeline(target=target, fusion=fusion, schedule=False, rollback=rollback, tuning_db=db,
                        progress=progress)
    lowered, _ = pipeline.lower(pipeline.prepare(import_model(model, example_inputs, shape_dict)))
    return extract_tasks(lowered, pipeline.target, all_kernels=fusion == "tvm")


def tune(model: Any, example_inputs: Sequence[Any] | None = None, *, db: str | os.PathLike | TuningDatabase,
         trials: int = 64, target: Any = None, fusion: Any = "autofuse", shape_dict: dict | None = None,
         options: TuneOptions | None = None, runner: Runner | None = None, builder: LocalBuilder | None = None,
         progress: Callable[[str], None] | None = None) -> TuneSummary:
    """Tune every kernel of ``model`` until ``db`` holds ``trials`` measured candidates for
    them in all, recording each measurement there.

    A rerun with the same database continues: candidates already measured are not measured
    again, and they count against ``trials`` (a rerun with the same ``trials`` measures
    nothing new; raise it to measure more). ``runner`` defaults to this machine (``schedules.measure.LocalRunner``); pass an
    ``RPCRunner`` to measure on the machines of an RPC tracker.

    With AutoFuse, each kernel of two or more ops is first timed against its ops apart and
    split where they are faster (``compile(rollback="measure")``); ``db`` records those
    decisions, so ``compile(tuning_db=db)`` builds the same kernels the records are of.
    """
    database = db if isinstance(db, TuningDatabase) else TuningDatabase(db)
    options = options or TuneOptions(trials=trials)
    rollback = "measure" if fusion == "autofuse" else "count"
    tasks = tasks_of(model, example_inputs, target=target, fusion=fusion, shape_dict=shape_dict, rollback=rollback,
                     db=database, progress=progress)
    measurer = KernelMeasurer(builder, runner)
    try:
        return Tuner(tasks, database, measurer, options, progress=progress).tune()
    finally:
        measurer.close()
