"""The tuner: search space, features, cost model, the tuning loop and the database's use.

Measurement here is a stand-in (a deterministic function of the candidate) so the loop's
logic is tested exactly and fast; real measurement is tested in test_measure.py and, end
to end, by the tuning tutorial.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import tvm_ffi
from tvm import relax

import tvm_ext
from schedules.cost_model import (
    CostModel,
    Sample,
    pairwise_accuracy,
    relevance,
    top_k_quality,
)
from schedules.database import TuningDatabase
from schedules.features import NAMES, candidate_features
from schedules.search_space import (apply_candidate, candidate_key, enumerate_space, heuristic_candidate,
                                    sample_space, space_bound)
from schedules.tasks import extract_tasks, kernel_key
from schedules.tuner import TuneOptions, Tuner
from tvm_ext.pipeline import Pipeline

R = relax.op


def _model(rows=6, cols=40):
    """softmax(x) * 2 + 1 and an elementwise x * sigmoid(x): two kernels, odd sizes."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, cols), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(R.nn.softmax(x))
            y = bb.emit(R.add(R.multiply(s, relax.const(2.0)), relax.const(1.0)))
            z = bb.emit(R.multiply(y, R.sigmoid(y)))
            gv = bb.emit_output(R.nn.relu(R.matmul(z, R.permute_dims(z))))
        bb.emit_func_output(gv)
    return bb.get()


def _reference(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    y = e / e.sum(-1, keepdims=True) * 2 + 1
    z = y / (1 + np.exp(-y))
    return np.maximum(z @ z.T, 0)


@pytest.fixture(scope="module")
def tasks():
    pipeline = Pipeline(schedule=False)
    lowered, _ = pipeline.lower(pipeline.prepare(_model()))
    return extract_tasks(lowered, pipeline.target)


class FakeMeasure:
    """A deterministic 'time' per candidate; optionally fails some and stops after N calls."""

    def __init__(self, fail=lambda c: False, stop_after=None):
        self.calls, self.seen = 0, []
        self.fail, self.stop_after = fail, stop_after

    def time_of(self, result) -> float:
        f = dict(zip(NAMES, candidate_features(result, tvm_ext.pipeline.Machine())))
        return 1.0 + 0.5 * (1 - f["vector_share"]) + 0.3 * (1 - f["parallel_share"]) + 0.1 * f["log_unroll"]

    def __call__(self, task, results):
        self.calls += 1
        if self.stop_after is not None and self.calls > self.stop_after:
            raise KeyboardInterrupt("killed")
        out = []
        for r in results:
            self.seen.append((task.key, candidate_key([[l, k] for l, k in r.choices])))
            if self.fail(r):
                out.append(([], "crashed (signal 11, SIGSEGV)"))
            else:
                out.append(([self.time_of(r)] * 3, None))
        return out


def test_tasks_are_deduplicated_by_structure_and_weighted():
    # the same add twice (two calls of one kernel) and a different one
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(R.exp(x))
            b = bb.emit(R.nn.softmax(a))
            c = bb.emit(R.exp(b))
            gv = bb.emit_output(R.nn.softmax(c))
        bb.emit_func_output(gv)
    pipeline = Pipeline(schedule=False, fusion="none")
    lowered, _ = pipeline.lower(pipeline.prepare(bb.get()))
    found = extract_tasks(lowered, pipeline.target)
    assert sorted(t.weight for t in found) == [2, 2]  # exp twice, softmax twice
    exp_task = next(t for t in found if "exp" in t.name)
    renamed = exp_task.func.with_attr("global_symbol", "another_name")
    assert kernel_key(renamed) == exp_task.key


def test_search_space_candidates_replay_from_json(tasks):
    task = next(t for t in tasks if "softmax" in t.name)
    space = enumerate_space(task.func, task.machine)
    keys = [candidate_key(c) for c, _ in space]
    assert 5 < len(space) <= space_bound(task.func, task.machine) and len(set(keys)) == len(keys)
    assert candidate_key(heuristic_candidate(task.func, task.machine)) in keys
    for c, result in space[:: max(1, len(space) // 5)]:
        again = apply_candidate(task.func, task.machine, json.loads(candidate_key(c))).func
        assert tvm_ffi.structural_equal(result.func, again)
    sampled = sample_space(task.func, task.machine, 12, seed=3)
    assert len({candidate_key(c) for c, _ in sampled}) == 12
    for c, result in sampled[:3]:
        assert tvm_ffi.structural_equal(result.func, apply_candidate(task.func, task.machine, c).func)


@pytest.mark.parametrize("mcpu", ["host", "skylake-avx512", "znver3", "x86-64"])
def test_search_space_has_no_duplicates_at_any_vector_width(tasks, mcpu):
    # built and enumerated for each target whatever the host has; nothing runs
    import tvm

    from schedules.analysis import Machine

    target = tvm_ext.host_target() if mcpu == "host" else tvm.target.Target({"kind": "llvm", "mcpu": mcpu,
                                                                             "num-cores": 2})
    machine = Machine.for_target(target)
    for task in tasks:
        keys = [candidate_key(c) for c, _ in enumerate_space(task.func, machine)]
        assert len(keys) > 0 and len(set(keys)) == len(keys), (mcpu, task.name)


def test_features_tell_candidates_apart(tasks):
    task = next(t for t in tasks if "softmax" in t.name)
    space = enumerate_space(task.func, task.machine)[:40]
    feats = np.stack([candidate_features(result, task.machine) for _, result in space])
    assert feats.shape == (len(space), len(NAMES)) and np.isfinite(feats).all()
    assert len({f.tobytes() for f in feats}) > len(space) // 2


def test_relevance_and_ranking_metrics():
    assert relevance([2.0, 1.0, math.inf, 4.0]).tolist() == [15, 30, 0, 8]
    assert pairwise_accuracy(np.array([3, 2, 1]), np.array([1.0, 2.0, 3.0])) == 1.0
    assert pairwise_accuracy(np.array([1, 2, 3]), np.array([1.0, 2.0, 3.0])) == 0.0
    assert top_k_quality(np.array([0, 5, 1]), np.array([1.0, 2.0, 4.0]), 1) == 0.5
    assert top_k_quality(np.array([0, 5, 1]), np.array([1.0, 2.0, 4.0]), 3) == 1.0


def test_cost_model_learns_a_ranking_and_transfers():
    rng = np.random.default_rng(0)

    def task(n, name):
        x = rng.random((n, 6)).astype("float32")
        ms = 1 + 3 * x[:, 0] + x[:, 1] ** 2 + 0.01 * rng.random(n)
        return [Sample(name, f, float(t)) for f, t in zip(x, ms)]

    model = CostModel()
    model.update(task(200, "a") + task(200, "b"))
    held = task(100, "c")  # a task the model has never seen
    scores = model.predict(np.stack([s.features for s in held]))
    times = np.array([s.ms for s in held])
    assert pairwise_accuracy(scores, times) > 0.8  # a random order scores 0.5
    assert top_k_quality(scores, times, 3) > 0.95


def test_tuning_records_everything_and_failures_do_not_stop_it(tasks, tmp_path):
    db = TuningDatabase(tmp_path / "db.jsonl")
    measure = FakeMeasure(fail=lambda r: "keep_2d" in r.policy)
    summary = Tuner(tasks, db, measure, TuneOptions(trials=30, batch=5, verify=False), progress=lambda s: None).tune()
    records = db.records()
    assert len(set(measure.seen)) == len(measure.seen)  # nothing measured twice
    assert sum(o.trials for o in summary.outcomes) == len(records) == 30
    assert any(r.error and "SIGSEGV" in r.error for r in records)
    for o in summary.outcomes:
        assert o.best_ms <= o.heuristic_ms
    assert "speed-up" in summary.table()


def test_a_killed_run_resumes_without_measuring_twice(tasks, tmp_path):
    path = tmp_path / "db.jsonl"
    first = FakeMeasure(stop_after=3)
    with pytest.raises(KeyboardInterrupt):
        Tuner(tasks, TuningDatabase(path), first, TuneOptions(trials=24, batch=4), progress=lambda s: None).tune()
    done = len(TuningDatabase(path).records())
    assert 0 < done < 24
    second = FakeMeasure()
    Tuner(tasks, TuningDatabase(path), second, TuneOptions(trials=24, batch=4, verify=False),
          progress=lambda s: None).tune()
    assert not set(first.seen[:done]) & set(second.seen)  # nothing measured twice
    assert len(TuningDatabase(path).records()) > done


def test_compile_applies_the_best_record(tasks, tmp_path):
    db = TuningDatabase(tmp_path / "db.jsonl")
    # a measurer for which only parallel-only schedules are fast: the tuner must find and keep one
    measure = FakeMeasure()
    measure.time_of = lambda r: 0.1 if "parallel_only" in r.policy else 1.0
    Tuner(tasks, db, measure, TuneOptions(trials=40, batch=8), progress=lambda s: None).tune()
    compiled = tvm_ext.compile(_model(), tuning_db=db)
    kernels = compiled.report().kernels
    tuned = [k for k in kernels if "[tuned]" in k.schedule]
    assert tuned and all("parallel_only" in k.schedule for k in tuned)
    x = np.random.default_rng(1).standard_normal((6, 40)).astype("float32")
    np.testing.assert_allclose(compiled(x), _reference(x), rtol=1e-4, atol=1e-4)


def test_command_line_tunes_then_compiles_from_the_records(tmp_path, capsys):
    from tvm_ext.cli import main
    db = str(tmp_path / "cli.jsonl")
    assert main(["tune", "elementwise_chain", "--trials", "3", "--batch", "2", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "speed-up" in out and "fused_sigmoid" in out
    assert len(TuningDatabase(db)) >= 3
    assert main(["compile", "elementwise_chain", "--db", db]) == 0
    assert "tuned schedules from" in capsys.readouterr().out


def test_a_record_that_no_longer_applies_warns_and_keeps_the_heuristic(tasks, tmp_path):
    from schedules.database import TuningRecord
    db = TuningDatabase(tmp_path / "db.jsonl")
    task = tasks[0]
    db.append(TuningRecord(task=task.key, target=task.target, candidate={"steps": [["keep_2d@no_such_block", {}]]},
                           times_ms=[0.001]))
    with pytest.warns(UserWarning, match=f"tuning record of kernel {task.name} does not apply"):
        compiled = tvm_ext.compile(_model(), tuning_db=db)
    x = np.random.default_rng(2).standard_normal((6, 40)).astype("float32")
    np.testing.assert_allclose(compiled(x), _reference(x), rtol=1e-4, atol=1e-4)


def test_trials_count_what_the_database_holds_so_a_rerun_tops_up(tasks, tmp_path):
    path = tmp_path / "db.jsonl"
    keys = lambda: {(r.task, r.key) for r in TuningDatabase(path).records()}  # noqa: E731
    quiet = dict(progress=lambda s: None)
    Tuner(tasks, TuningDatabase(path), FakeMeasure(), TuneOptions(trials=16, batch=4, verify=False), **quiet).tune()
    assert len(keys()) == 16
    again = FakeMeasure()
    Tuner(tasks, TuningDatabase(path), again, TuneOptions(trials=16, batch=4, verify=False), **quiet).tune()
    assert again.seen == [] and len(keys()) == 16  # the same budget: nothing new to measure
    more = FakeMeasure()
    Tuner(tasks, TuningDatabase(path), more, TuneOptions(trials=24, batch=4, verify=False), **quiet).tune()
    assert len(keys()) == 24 and len(more.seen) == 8  # topped up to 24
