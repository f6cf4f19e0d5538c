"""The autotuner: for every task, measure few candidates, chosen by the cost model.

Each task first measures its heuristic candidate (the untuned choice: the baseline every
figure is compared with). The rest of the trial budget goes to tasks in proportion to the
time they take in the model (weight x heuristic time). A task then runs in batches: the
cost model ranks a pool of not-yet-measured candidates, the batch takes the top ones plus
a few random ones (exploration), the batch is measured, recorded in the database, and the
model retrains. Everything measured goes to the database as it is measured, so a killed
run loses at most one batch and a rerun skips what is already there.

Only records measured on this machine count (``TuningRecord.matches``). The model of a task
is trained on its own measurements plus, as a warm start, those of tasks of the same kernel
class, weighted by how alike the kernels' sizes are and fading as the task's own
measurements accumulate. Once a task has a few measurements of its own, the transferred
model is checked on them: if it orders them worse than chance the task goes on cold. Until
that check has passed, the transferred samples stay out of the model, so the task's first
batch is the one a cold start would measure (the heuristic's nearest neighbours and a few
random candidates): an unchecked model ranked first on layer norm led the warm start to the
good candidates after 6 trials where cold took 2-4 (AMD EPYC Zen 4). A candidate whose
repeats spread by more than ``TuneOptions.noisy`` is measured again, and its noisy record
then counts no more (``history.steady``).
"""
from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

import numpy as np
import tvm
import tvm_ffi

from schedules.cost_model import CostModel, Sample, pairwise_accuracy, top_k_quality
from schedules.database import TuningDatabase, TuningRecord
from schedules.features import NAMES, PER_STORE_LENGTH, candidate_features, per_store_features
from schedules.history import NOISY, pooled_best, pooled_ms, pooled_times, recorded_times, spread_of, steady
from schedules.search_space import (Candidate, apply_candidate, candidate_key, enumerate_space,
                                    heuristic_candidate, sample_space, space_bound)
from schedules.tasks import Task


class Measurer(Protocol):
    """Times candidates of one task: (median-able times in ms, error or None) per result."""

    def __call__(self, task: Task, results: list) -> list[tuple[list[float], str | None]]: ...


@dataclass
class TuneOptions:
    trials: int = 64  # distinct candidates over all tasks, heuristics and earlier runs' included
    batch: int = 8
    explore: float = 0.25  # share of each batch picked at random
    local: float = 0.25  # share of each batch taken from the nearest neighbours of the best so far
    pool: int = 32  # in a space too large to enumerate: candidates drawn per batch for the model to rank
    space_limit: int = 512  # a space up to this size is enumerated
    seed: int = 0
    verify: bool = True  # re-measure the heuristic and the best side by side at the end
    per_store: bool = False  # add TVM's PerStoreFeature to the model's features
    noisy: float = NOISY  # a candidate whose repeats spread more than this ((max - min) / median) is measured again
    judge_after: int = 4  # own measurements (of distinct times) before the warm start is checked


@dataclass
class TaskOutcome:
    task: Task
    trials: int = 0  # measured in this run
    heuristic_ms: float = math.inf
    best_ms: float = math.inf
    best: Candidate | None = None
    failures: int = 0
    remeasured: int = 0  # candidates measured again because their repeats spread too much
    spread: float = float("nan")  # the best's (max - min) / median over all its recorded times
    start: str = "cold"  # how the task's model started: "warm (...)" or "cold (why)"

    @property
    def speedup(self) -> float:
        return self.heuristic_ms / self.best_ms if math.isfinite(self.best_ms) else float("nan")


@dataclass
class TuneSummary:
    outcomes: list[TaskOutcome]
    seconds: float
    quality: dict = field(default_factory=dict)
    model_check: tuple[float, float] | None = None  # the whole model as called: (tuned ms, untuned ms)

    def table(self) -> str:
        rows = [f"{'task':44s} {'calls':>5s} {'trials':>6s} {'failed':>6s} {'heuristic ms':>12s} {'best ms':>9s} "
                f"{'spread':>6s} {'speed-up':>8s}  model"]
        for o in self.outcomes:
            rows.append(f"{o.task.name[:44]:44s} {o.task.weight:5d} {o.trials:6d} {o.failures:6d} {o.heuristic_ms:12.4f} "
                        f"{o.best_ms:9.4f} {o.spread:6.1%} {o.speedup:7.2f}x  {o.start}")
        before = sum(o.task.weight * o.heuristic_ms for o in self.outcomes if math.isfinite(o.heuristic_ms))
        after = sum(o.task.weight * min(o.best_ms, o.heuristic_ms) for o in self.outcomes
                    if math.isfinite(o.heuristic_ms))
        rows.append(f"kernel time, weighted by calls: {before:.4f} ms untuned -> {after:.4f} ms tuned "
                    f"({before / after if after else float('nan'):.2f}x), {self.seconds:.0f} s")
        if self.quality:
            q = self.quality
            rows.append(f"cost model on held-out measured candidates ({q['tasks']} tasks, {q['pairs']} pairs): "
                        f"pairwise ranking accuracy {q['pairwise_accuracy']:.3f}; measuring only its top-{q['k']} "
                        f"finds {q['top_k_quality']:.1%} of the best")
        if self.model_check is not None:
            tuned, untuned = self.model_check
            rows.append(f"the model as called: {tuned:.4f} ms tuned, {untuned:.4f} ms untuned: the records "
                        + ("apply" if tuned <= untuned else "are not used (compile builds it untuned)"))
        return "\n".join(rows)


class Tuner:
    """Tune ``tasks`` with ``measure``, recording every measurement in ``db``."""

    def __init__(self, tasks: list[Task], db: TuningDatabase, measure: Measurer,
                 options: TuneOptions | None = None, transfer: list[Sample] | None = None,
                 progress: Callable[[str], None] | None = None):
        self.tasks = tasks
        self.db = db
        self.measure = measure
        self.options = options or TuneOptions()
        self.transfer = list(transfer or [])  # other tasks' samples, given besides the database's
        self.model = CostModel(seed=self.options.seed)  # the model of the task being tuned
        self.progress = progress or ProgressLine()
        self.rng = random.Random(self.options.seed)
        self._features: dict[tuple[str, str], np.ndarray] = {}
        self._start: dict[str, str] = {}  # task key -> how its model started, once judged
        self._spent = 0

    # ------------------------------------------------------------------ the run
    def tune(self) -> TuneSummary:
        t0 = time.perf_counter()
        outcomes = [TaskOutcome(t) for t in self.tasks]
        # the budget counts what the database already holds for these tasks: a rerun tops up
        # to ``trials`` (as MetaSchedule's max_trials_global) instead of measuring that many more
        self._spent = sum(len(self._measured(t)) for t in self.tasks)
        heuristics = {}
        for o in outcomes:  # the baseline first: every task's heuristic candidate
            heur = heuristics[o.task.key] = heuristic_candidate(o.task.func, o.task.machine, o.task.fuse_epilogue)
            if candidate_key(heur) not in self._measured(o.task):
                self._measure(o, [(heur, apply_candidate(o.task.func, o.task.machine, heur, o.task.name))])
            o.heuristic_ms = pooled_ms(self._records(o.task), heur)

        def label(i: int) -> str:
            return f"task {i + 1}/{len(outcomes)}"

        # a task whose space runs out before its share leaves the rest to the tasks after it;
        # what is still left at the end goes to those that used all they were given
        left, more = 0, []
        for i, (o, budget) in enumerate(zip(outcomes, self._budgets(outcomes))):
            left = budget + left - self._tune_task(o, budget + left, label(i), heuristics[o.task.key])
            if left == 0:
                more.append(i)
        for i in more:
            if left > 0:
                left -= self._tune_task(outcomes[i], left, label(i), heuristics[outcomes[i].task.key])
        for o in outcomes:  # a rerun's best may come from the database
            best = self._best_known(o.task)
            if best is not None and best[1] < o.best_ms:
                o.best, o.best_ms = best
        if self.options.verify:
            self._verify(outcomes, heuristics)
        for o in outcomes:
            o.spread = _spread(self._records(o.task), o.best)
            o.start = self._start.get(o.task.key, o.start)
        quality = self.quality()
        self.progress("")
        return TuneSummary(outcomes, time.perf_counter() - t0, quality)

    def _verify(self, outcomes: list[TaskOutcome], heuristics: dict, top: int = 3) -> None:
        """Measure each task's heuristic and its best few candidates again, side by side, and
        keep the one with the lowest median over all its measurements: the minimum of many
        noisy single measurements is biased low (a lucky run), a pooled median is not."""
        for o in outcomes:
            records = self._records(o.task)
            heur = heuristics[o.task.key]
            ranked = sorted(pooled_times(records).values(), key=lambda cm: cm[1])
            check = [heur] + [c for c, _ in ranked if candidate_key(c) != candidate_key(heur)][:top]
            if len(check) > 1:
                self._measure(o, [(c, apply_candidate(o.task.func, o.task.machine, c, o.task.name)) for c in check])
            records = self._records(o.task)
            o.heuristic_ms = pooled_ms(records, heur)
            best = pooled_best(records)
            if best is not None:
                o.best, o.best_ms = best

    def _budgets(self, outcomes: list[TaskOutcome]) -> list[int]:
        """The trials left after the baselines, shared by weight x heuristic time."""
        left = max(0, self.options.trials - self._spent)
        cost = [o.task.weight * (o.heuristic_ms if math.isfinite(o.heuristic_ms) else 1.0) for o in outcomes]
        total = sum(cost) or 1.0
        shares = [int(left * c / total) for c in cost]
        for i in sorted(range(len(cost)), key=lambda i: -cost[i])[:left - sum(shares)]:
            shares[i] += 1
        return shares

    def _tune_task(self, o: TaskOutcome, budget: int, label: str, heuristic: Candidate) -> int:
        """Measure up to ``budget`` new candidates of the task; return how many it measured."""
        task, opts = o.task, self.options
        exhaustive = space_bound(task.func, task.machine) <= opts.space_limit
        space = dict(self._entries(enumerate_space(task.func, task.machine, opts.space_limit, heuristic))) \
            if exhaustive else {}
        measured = self._measured(task)
        # a large space's pools are each of distinct kernels; across pools (and against the
        # heuristic, measured already) the kernels' hashes keep a second key of one out
        heuristic_key = candidate_key(heuristic)
        kernels = set() if exhaustive else {
            tvm_ffi.structural_hash(apply_candidate(task.func, task.machine, heuristic).func.body)}
        self._fit(task)
        spent, round_ = 0, 0
        while spent < budget:
            if not exhaustive:  # a large space: draw a fresh pool each batch
                round_ += 1
                for key, entry in self._entries(sample_space(task.func, task.machine, opts.pool,
                                                             seed=opts.seed * 7919 + round_, prefer=heuristic)):
                    kernel = tvm_ffi.structural_hash(entry[1].func.body)
                    if key not in space and (kernel not in kernels or key == heuristic_key):
                        space[key] = entry
                        kernels.add(kernel)
            todo = [k for k in space if k not in measured]
            if not todo:
                break
            self.rng.shuffle(todo)  # ties (in score or nearness) break at random
            batch = self._propose(task, space, todo, min(opts.batch, budget - spent), o.best)
            measured.update(batch)
            spent += self._measure(o, [space[k] for k in batch])
            self._judge(task)
            self._fit(task)
            self.progress(f"[{label} {task.name[:36]}] {spent}/{budget} trials | total {self._spent}/"
                          f"{opts.trials} | best {o.best_ms:.4f} ms ({o.speedup:.2f}x over untuned)")
        return spent

    @staticmethod
    def _entries(pairs: list) -> list[tuple[str, tuple]]:
        return [(candidate_key(c), (c, r)) for c, r in pairs]

    def _propose(self, task: Task, space: dict, todo: list[str], n: int, best: Candidate | None) -> list[str]:
        """A batch: the model's top candidates, the nearest neighbours of the best so far (the
        heuristic's at first: a strong prior, and all an untrained model has), random ones."""
        opts = self.options
        local = max(1, round(n * opts.local)) if best is not None else 0
        explore = max(1, round(n * opts.explore))
        if not self.model.trained:
            local = n - explore if best is not None else 0
        chosen: list[str] = []
        if n - local - explore > 0:
            feats = np.stack([self._features_of(task, k, space[k][1]) for k in todo])
            ranked = [todo[i] for i in np.argsort(-self.model.predict(feats), kind="stable")]
            chosen = ranked[:n - local - explore]
        if local:
            near = _traits(best)
            rest = [k for k in todo if k not in set(chosen)]
            rest.sort(key=lambda k: -len(near & _traits(space[k][0])))  # stable: ties keep todo's order
            chosen += rest[:local]
        rest = [k for k in todo if k not in set(chosen)]
        return chosen + self.rng.sample(rest, min(len(rest), n - len(chosen)))

    # ------------------------------------------------------------------ measuring and recording
    def _measure(self, o: TaskOutcome, entries: list[tuple[Candidate, object]]) -> int:
        """Measure (candidate, ScheduleResult) pairs, record them, update the task's best; those
        whose repeats spread by more than ``options.noisy`` once more (the steady measurement counts)."""
        task = o.task
        measured = self.measure(task, [r for _, r in entries]) if entries else []
        ok = []
        for (c, r), (times, error) in zip(entries, measured):
            self._record(task, c, times, error, self._features_of(task, candidate_key(c), r))
            if error is not None:
                o.failures += 1
            elif times:
                ok.append((c, r, times))
        noisy = [(c, r) for c, r, times in ok if spread_of(times) > self.options.noisy]
        if noisy:
            for (c, r), (times, error) in zip(noisy, self.measure(task, [r for _, r in noisy])):
                self._record(task, c, times, error, self._features_of(task, candidate_key(c), r))
            o.remeasured += len(noisy)
        if ok:  # each candidate's time as compile will read it: the median of its steady records
            pooled = pooled_times(self._records(task))
            for c, _, _ in ok:
                ms = pooled[candidate_key(c)][1]
                if ms < o.best_ms:
                    o.best_ms, o.best = ms, c
        o.trials += len(entries)
        self._spent += len(entries)
        return len(entries)

    def _record(self, task: Task, c: Candidate, times: list[float], error: str | None,
                feats: np.ndarray | None = None) -> None:
        self.db.append(task_record(task, c, times, error, feats))

    def _records(self, task: Task) -> list[TuningRecord]:
        """The task's records measured on a machine like this task's (``TuningRecord.matches``)."""
        return [r for r in self.db.records(task.key, task.target) if r.matches(task.machine)]

    def _measured(self, task: Task) -> set[str]:
        return {candidate_key(r.candidate["steps"]) for r in self._records(task)}

    def _best_known(self, task: Task) -> tuple[Candidate, float] | None:
        return pooled_best(self._records(task))

    # ------------------------------------------------------------------ the model's data
    def _features_of(self, task: Task, key: str, result) -> np.ndarray:
        if (task.key, key) not in self._features:
            feats = candidate_features(result, task.machine)
            if self.options.per_store:
                feats = np.concatenate([feats, per_store_features(result, tvm.target.Target(task.target))])
            self._features[(task.key, key)] = feats
        return self._features[(task.key, key)]

    def _own(self, task: Task) -> list[Sample]:
        """The task's samples: its steady records (``history.steady``) and its failures."""
        return [Sample(task.key, np.asarray(r.features, dtype="float32"), r.median_ms, 1.0, task.kernel_class)
                for r in _counted(self._records(task)) if r.features is not None and len(r.features) == self._length]

    def _similar(self, task: Task, own: int) -> list[Sample]:
        """Other tasks' samples of the same kernel class, measured on this machine: the
        database's and the given ``transfer``, each weighted by the kernels' likeness and
        by ``8 / (8 + own)``, so that the task's own measurements take over as they come."""
        records = _counted([r for r in self._usable() if r.task != task.key and r.target == task.target
                            and r.kernel_class == task.kernel_class and r.matches(task.machine)])
        samples = [Sample(r.task, np.asarray(r.features, dtype="float32"), r.median_ms, 1.0, r.kernel_class)
                   for r in records]
        samples += [s for s in self.transfer if s.task != task.key and s.kernel_class == task.kernel_class]
        if not samples:
            return []
        return transfer_weights(samples, self._size_of(task), own)

    def _size_of(self, task: Task) -> np.ndarray:
        own = self._own(task)
        return own[0].features if own else np.zeros(len(NAMES), dtype="float32")

    def _fit(self, task: Task) -> None:
        """Retrain the model for ``task``: its own samples, plus similar tasks' once the judge has
        found them better than chance on the task's own first measurements."""
        own = self._own(task)
        warm = self._similar(task, len(own)) if self._transfers(task) else []
        self.model = CostModel(seed=self.options.seed)
        self.model.fit(own + warm)

    def _transfers(self, task: Task) -> bool:
        """Whether similar tasks' samples join ``task``'s model: once the judge kept them."""
        return self._start.get(task.key, "").startswith("warm")

    def _judge(self, task: Task) -> None:
        """Once the task has ``judge_after`` measurements of distinct times, score them with a model
        trained on the similar tasks alone: worse than chance (pairwise accuracy < 0.5) and the
        task goes on cold."""
        if task.key in self._start:
            return
        own = [s for s in self._own(task) if math.isfinite(s.ms)]
        if len({s.ms for s in own}) < self.options.judge_after:
            return
        similar = self._similar(task, 0)
        if not similar:
            self._start[task.key] = "cold (no similar task measured here)"
            return
        model = CostModel(seed=self.options.seed)
        model.fit(similar)
        acc = pairwise_accuracy(model.predict(np.stack([s.features for s in own])), np.array([s.ms for s in own]))
        if not model.trained or not acc >= 0.5:
            self._start[task.key] = f"cold (the transferred model ranked its first {len(own)} at {acc:.2f})"
            self.progress(f"[{task.name[:36]}] warm start dropped: {self._start[task.key][6:-1]}, worse than chance")
        else:
            self._start[task.key] = f"warm ({acc:.2f} on its first {len(own)})"

    @property
    def _length(self) -> int:
        return len(NAMES) + (PER_STORE_LENGTH if self.options.per_store else 0)

    def _usable(self) -> list[TuningRecord]:
        """Records whose features this run's model can read (same feature set)."""
        return [r for r in self.db.records() if r.features is not None and len(r.features) == self._length]

    # ------------------------------------------------------------------ honesty
    def quality(self, k: int = 3, seed: int = 0) -> dict:
        """The model's accuracy on held-out measured candidates: for each task with enough
        successful records, train as the tuner does (half of its own records, plus the similar
        tasks' where the judge kept them) and score the other half."""
        rng = random.Random(seed)
        accs, tops, pairs = [], [], 0
        for task in self.tasks:
            ok = [s for s in self._own(task) if math.isfinite(s.ms)]
            if len(ok) < 2 * k + 2:
                continue
            rng.shuffle(ok)
            held, train = ok[:len(ok) // 2], ok[len(ok) // 2:]
            if self._transfers(task):
                train += self._similar(task, len(train))
            model = CostModel(seed=seed)
            model.fit(train)
            if not model.trained:
                continue
            scores = model.predict(np.stack([s.features for s in held]))
            times = np.array([s.ms for s in held])
            acc = pairwise_accuracy(scores, times)
            if not math.isnan(acc):
                accs.append(acc)
                tops.append(top_k_quality(scores, times, k))
                pairs += len(held) * (len(held) - 1) // 2
        if not accs:
            return {}
        return {"tasks": len(accs), "pairs": pairs, "k": k, "pairwise_accuracy": float(np.mean(accs)),
                "top_k_quality": float(np.mean(tops))}


def task_record(task: Task, c: Candidate, times: list[float], error: str | None,
                feats: np.ndarray | None = None) -> TuningRecord:
    """The record of one measurement of ``c``, with the task's kernel and the machine that measured it."""
    machine = task.machine
    return TuningRecord(task=task.key, target=task.target, candidate={"steps": c}, times_ms=[float(t) for t in times],
                        error=error, features=None if feats is None else [float(x) for x in feats],
                        kernel=task.name, cpu=machine.cpu, vector_bits=machine.vector_bits,
                        kernel_class=task.kernel_class)


def transfer_weights(samples: list[Sample], here: np.ndarray, own: int) -> list[Sample]:
    """Other tasks' samples weighted for a task whose features are ``here`` and which has ``own``
    measurements: by the kernels' likeness and by ``8 / (8 + own)``."""
    fade = 8 / (8 + own)
    return [replace(s, weight=s.weight * fade * likeness(here, s.features)) for s in samples]


def likeness(a: np.ndarray, b: np.ndarray) -> float:
    """How alike two kernels are in size: 1 for equal bytes and work, halving every 4 doublings apart."""
    i, j = NAMES.index("log_bytes"), NAMES.index("log_work")
    return float(2 ** (-(abs(a[i] - b[i]) + abs(a[j] - b[j])) / 4))


def _counted(records: list[TuningRecord]) -> list[TuningRecord]:
    """The records a model learns from: the steady ones of each candidate, and the failures."""
    return steady(records) + [r for r in records if not (r.ok and r.times_ms)]


def _spread(records: list[TuningRecord], candidate: Candidate | None) -> float:
    """(max - min) / median over every time recorded for ``candidate``."""
    if candidate is None:
        return float("nan")
    entry = recorded_times(records).get(candidate_key(candidate))
    return spread_of(entry[1]) if entry else float("nan")


def _traits(candidate: Candidate) -> set:
    """What a candidate is made of: each step's policy and block, each knob's value."""
    out = set()
    for label, knobs in candidate:
        out.add(label)
        out.update((label, k, v) for k, v in knobs.items())
    return out


class ProgressLine:
    """One status line, rewritten in place on a terminal, one line per update otherwise."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last = 0

    def __call__(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r" + text.ljust(self._last) + ("\n" if not text else ""))
            self._last = len(text)
        elif text:
            self.stream.write(text + "\n")
        self.stream.flush()

