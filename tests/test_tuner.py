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
from conftest import another_mcpu
from schedules.cost_model import (
    CostModel,
    Sample,
    log_speed,
    pairwise_accuracy,
    top_k_quality,
)
from schedules.database import TuningDatabase, TuningRecord
from schedules.features import NAMES, candidate_features
from schedules.history import pooled_best, pooled_times, steady
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


def _tasks_for(target=None) -> list:
    pipeline = Pipeline(target=target, schedule=False)
    lowered, _ = pipeline.lower(pipeline.prepare(_model()))
    return extract_tasks(lowered, pipeline.target)


@pytest.fixture(scope="module")
def tasks():
    return _tasks_for()


@pytest.fixture(scope="module")
def avx512_tasks():
    """The tasks built for one AVX-512 CPU whatever the host, for tests of the tuner's course
    with fake measurements, which depends on the space (plain x86-64's SSE2 makes another)."""
    from tvm_ext.target import cpu_target
    return _tasks_for(cpu_target("skylake-avx512"))


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
    heuristic = heuristic_candidate(task.func, task.machine)
    assert candidate_key(heuristic) in [candidate_key(c) for c, _ in enumerate_space(task.func, task.machine,
                                                                                      prefer=heuristic)]
    for c, result in space[:: max(1, len(space) // 5)]:
        again = apply_candidate(task.func, task.machine, json.loads(candidate_key(c))).func
        assert tvm_ffi.structural_equal(result.func, again)
    sampled = sample_space(task.func, task.machine, 12, seed=3)
    assert len({candidate_key(c) for c, _ in sampled}) == 12
    for c, result in sampled[:3]:
        assert tvm_ffi.structural_equal(result.func, apply_candidate(task.func, task.machine, c).func)


def test_a_knob_that_changes_nothing_makes_no_second_candidate():
    # a bare matmul has no epilogue to fuse: epilogue True and False build one kernel, and
    # only the first enumerated stays, unless the other is the one preferred (the heuristic's)
    from tvm import te

    from tvm_ext.machine import Machine

    A, B = te.placeholder((64, 64), "float32", name="A"), te.placeholder((64, 64), "float32", name="B")
    k = te.reduce_axis((0, 64), "k")
    func = te.create_prim_func([A, B, te.compute((64, 64), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")])
    machine = Machine(cores=2, vector_bytes=64)
    space = enumerate_space(func, machine)
    keys = {candidate_key(c) for c, _ in space}
    first = space[0][0]
    assert first[0][1]["epilogue"] is True
    twin = [[first[0][0], {**first[0][1], "epilogue": False}]]
    assert tvm_ffi.structural_equal(apply_candidate(func, machine, twin).func.body, space[0][1].func.body)
    assert candidate_key(twin) not in keys
    tiles = [c[0][1] for c, _ in space if c[0][0].startswith("register_tile")]
    # (4 x 32, 8 x 32, 8 x 16: the tiles of 128 sums or more) x 2 unrolls; each False had a True twin
    assert len(tiles) == 6 and all(knobs["epilogue"] for knobs in tiles)
    preferring = [candidate_key(c) for c, _ in enumerate_space(func, machine, prefer=twin)]
    assert preferring[0] == candidate_key(twin) and len(preferring) == len(space)


@pytest.mark.parametrize("mcpu", ["host", "skylake-avx512", "znver3", "x86-64"])
def test_search_space_has_no_duplicates_at_any_vector_width(tasks, mcpu):
    # built and enumerated for each target whatever the host has; nothing runs
    import tvm

    from tvm_ext.machine import Machine

    target = tvm_ext.host_target() if mcpu == "host" else tvm.target.Target({"kind": "llvm", "mcpu": mcpu,
                                                                             "num-cores": 2})
    machine = Machine.for_target(target)
    for task in tasks:
        space = enumerate_space(task.func, machine)
        keys = [candidate_key(c) for c, _ in space]
        assert len(keys) > 0 and len(set(keys)) == len(keys), (mcpu, task.name)
        # and no two keys build one kernel (a knob that changes nothing for this block: rows of
        # 40 at 8 lanes are 5 vector steps, one chain of adds whatever ``accumulators`` says)
        kernels = {}
        for key, (_, result) in zip(keys, space):
            kernels.setdefault(tvm_ffi.structural_hash(result.func.body), []).append(key)
        assert all(len(same) == 1 for same in kernels.values()), (mcpu, task.name, [
            same for same in kernels.values() if len(same) > 1][:2])


def test_features_tell_candidates_apart(tasks):
    task = next(t for t in tasks if "softmax" in t.name)
    space = enumerate_space(task.func, task.machine)[:40]
    feats = np.stack([candidate_features(result, task.machine) for _, result in space])
    assert feats.shape == (len(space), len(NAMES)) and np.isfinite(feats).all()
    assert len({f.tobytes() for f in feats}) > len(space) // 2


def test_relevance_and_ranking_metrics():
    labels = log_speed([2.0, 1.0, math.inf, 4.0])
    np.testing.assert_allclose(labels, [-math.log(2), 0, -math.log(4) - 1, -math.log(4)], rtol=1e-6)
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


def test_a_sampled_space_measures_each_kernel_once(tmp_path):
    # space_limit 8: a bare matmul's space is drawn in pools of 6. Its epilogue knob changes
    # nothing (there is none): a kernel drawn again in a later pool under the other key, or
    # the heuristic's twin, is not measured again (before: 35 trials measured 22 kernels). A k
    # of 512 (three k blocks) leaves more than 10 kernels on every CPU once the tiles too small
    # for the FMA units are out (at 128, 7 built for znver3)
    bb = relax.BlockBuilder()
    a, b = relax.Var("a", relax.TensorType((64, 512), "float32")), relax.Var("b", relax.TensorType((512, 64), "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            gv = bb.emit_output(R.matmul(a, b))
        bb.emit_func_output(gv)
    pipeline = Pipeline(schedule=False)
    (task,) = extract_tasks(pipeline.lower(pipeline.prepare(bb.get()))[0], pipeline.target)
    measure = FakeMeasure()
    Tuner([task], TuningDatabase(tmp_path / "db.jsonl"), measure,
          TuneOptions(trials=40, batch=4, pool=6, space_limit=8, verify=False), progress=lambda s: None).tune()
    kernels = [tvm_ffi.structural_hash(apply_candidate(task.func, task.machine, json.loads(c)).func.body)
               for _, c in measure.seen]
    assert len(kernels) > 10 and len(set(kernels)) == len(kernels)


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


def test_trials_a_task_cannot_use_go_to_the_others(tasks, tmp_path):
    # the matmul's kernel is made the slowest, so its share is most of the budget, but its
    # space (6 x 6 tiles) holds fewer candidates: the rest goes to the other tasks (before, 40
    # trials measured 12 candidates)
    db = TuningDatabase(tmp_path / "db.jsonl")
    measure = FakeMeasure()
    measure.time_of = lambda r: 10.0 if "register_tile" in r.policy else 0.1
    summary = Tuner(tasks, db, measure, TuneOptions(trials=40, batch=4, verify=False), progress=lambda s: None).tune()
    matmul = next(o for o in summary.outcomes if "matmul" in o.task.name)
    assert matmul.trials == len(enumerate_space(matmul.task.func, matmul.task.machine)) < 40 // 2
    assert sum(o.trials for o in summary.outcomes) == len(db.records()) == 40


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
    assert "speed-up" in out and "fused_silu" in out
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


# ---------------------------------------------------------------------- the tuner on every CPU
def _retarget(db: TuningDatabase, path, **changes) -> TuningDatabase:
    """A copy of ``db`` whose records claim another measuring machine."""
    import dataclasses
    other = TuningDatabase(path)
    for r in db.records():
        other.append(dataclasses.replace(r, **changes))
    return other


def test_a_record_from_another_target_is_not_applied(tasks, tmp_path):
    db = TuningDatabase(tmp_path / "here.jsonl")
    measure = FakeMeasure()
    measure.time_of = lambda r: 0.1 if "parallel_only" in r.policy else 1.0
    Tuner(tasks, db, measure, TuneOptions(trials=40, batch=8), progress=lambda s: None).tune()
    here = tasks[0].machine
    assert here.cpu and all(r.cpu == here.cpu and r.vector_bits == here.vector_bits for r in db.records())

    def tuned(database) -> list[str]:
        return [k.name for k in tvm_ext.compile(_model(), tuning_db=database).report().kernels
                if "[tuned]" in k.schedule]

    assert tuned(db)
    for i, changes in enumerate([{"cpu": "Another CPU (family 1, model 2)"}, {"vector_bits": here.vector_bits // 2},
                                 {"target": tasks[0].target.replace(f'"mcpu":"{here_mcpu()}"',
                                                                    f'"mcpu":"{another_mcpu()}"')}]):
        other = _retarget(db, tmp_path / f"other{i}.jsonl", **changes)
        with pytest.warns(UserWarning, match="are not applied here"):
            assert tuned(other) == [], changes
    # one database filled by two machines: this machine's records still apply, the other's do not
    shared = _retarget(db, tmp_path / "shared.jsonl", cpu="Another CPU (family 1, model 2)")
    for r in db.records():
        shared.append(r)
    with pytest.warns(UserWarning, match="Another CPU"):
        assert tuned(shared) == tuned(db)


def here_mcpu() -> str:
    from tvm_ext.machine import host_mcpu
    return host_mcpu()


def _transfer_from(task, sign: float, n: int = 60) -> list[Sample]:
    """Samples of a made-up task of ``task``'s kernel class: its candidates with the fake times,
    in the same order (sign 1) or reversed (sign -1)."""
    fake = FakeMeasure()
    out = []
    for _, result in enumerate_space(task.func, task.machine)[:n]:
        t = fake.time_of(result)
        out.append(Sample("another_task", candidate_features(result, task.machine), 3.0 + sign * (t - 1.5), 1.0,
                          task.kernel_class))
    return out


@pytest.mark.parametrize("sign, start", [(1.0, "warm"), (-1.0, "cold")])
def test_a_warm_start_that_ranks_this_task_backwards_falls_back_to_cold(tasks, tmp_path, sign, start):
    task = next(t for t in tasks if "softmax" in t.name)
    options = TuneOptions(trials=20, batch=6, verify=False)
    summary = Tuner([task], TuningDatabase(tmp_path / "db.jsonl"), FakeMeasure(), options,
                    transfer=_transfer_from(task, sign), progress=lambda s: None).tune()
    assert summary.outcomes[0].start.startswith(start), summary.outcomes[0].start
    assert start in summary.table()


def test_a_transferred_model_ranks_nothing_before_it_is_judged(avx512_tasks, tmp_path):
    # the first batch after the heuristic is the one a cold start measures, whatever the other
    # task's records say: on layer norm (AMD Zen 4) a transferred model ranked first led the
    # warm start to the good candidates after 6 trials, where cold took 2-4
    task = next(t for t in avx512_tasks if "softmax" in t.name)
    options = TuneOptions(trials=14, batch=6, verify=False)
    seen = {}
    for sign in (1.0, -1.0, None):
        fake = FakeMeasure()
        Tuner([task], TuningDatabase(tmp_path / f"db{sign}.jsonl"), fake, options,
              transfer=[] if sign is None else _transfer_from(task, sign), progress=lambda s: None).tune()
        seen[sign] = [key for _, key in fake.seen]
    assert seen[1.0][:7] == seen[-1.0][:7] == seen[None][:7]  # the heuristic and one batch
    assert seen[1.0] != seen[-1.0]  # then the judged warm model (or the cold one) ranks


def test_transfer_takes_only_tasks_of_the_same_kernel_class(tasks, tmp_path):
    softmax = next(t for t in tasks if "softmax" in t.name)
    other = next(t for t in tasks if t.kernel_class != softmax.kernel_class)
    tuner = Tuner([softmax], TuningDatabase(tmp_path / "db.jsonl"), FakeMeasure(),
                  transfer=_transfer_from(softmax, 1.0) + _transfer_from(other, 1.0), progress=lambda s: None)
    similar = tuner._similar(softmax, own=8)
    assert similar and {s.kernel_class for s in similar} == {softmax.kernel_class}
    assert all(0 < s.weight <= 0.5 for s in similar)  # faded by 8 / (8 + 8), and by likeness


def test_a_candidate_whose_repeats_spread_is_measured_again(tasks, tmp_path):
    class Noisy(FakeMeasure):
        def __call__(self, task, results):
            out = super().__call__(task, results)
            first = self.calls == 2  # the first batch after the heuristic: one noisy candidate
            return [([t[0], t[0] * 1.5, t[0]], e) if first and i == 0 and e is None else (t, e)
                    for i, (t, e) in enumerate(out)]

    db = TuningDatabase(tmp_path / "db.jsonl")
    task = next(t for t in tasks if "softmax" in t.name)
    summary = Tuner([task], db, Noisy(), TuneOptions(trials=9, batch=8, verify=False), progress=lambda s: None).tune()
    o = summary.outcomes[0]
    assert o.remeasured == 1 and o.trials == 9  # measured again, not counted as another trial
    keys = [r.key for r in db.records()]
    assert len(keys) == 10 and len(set(keys)) == 9
    assert o.spread == 0.0 and "spread" in summary.table()


def test_a_noisy_record_counts_no_more_once_the_candidate_is_measured_steadily():
    def rec(task, tile, times):
        return TuningRecord(task=task, target="llvm", candidate={"steps": [["tile", {"tile": tile}]]},
                            times_ms=list(times))

    records = [rec("a", 8, [3.4, 4.0, 1.2, 1.0, 2.4]),  # another process held the machine: spread 1.25
               rec("a", 8, [1.0, 1.02, 0.98]),  # measured again, steady
               rec("a", 16, [2.0, 3.0, 2.0]), rec("a", 16, [1.0, 1.5, 1.0]),  # never steady: all pooled
               rec("b", 8, [5.0, 5.0, 5.0])]  # the same candidate of another task stays apart
    assert len(steady(records)) == 4
    times = {k: ms for k, (_, ms) in pooled_times(records[:4]).items()}
    assert times[candidate_key([["tile", {"tile": 8}]])] == 1.0  # 1.11 pooled with the noisy record
    assert times[candidate_key([["tile", {"tile": 16}]])] == 1.75  # median of 1, 1, 1.5, 2, 2, 3
    assert pooled_times(records[4:])[candidate_key([["tile", {"tile": 8}]])][1] == 5.0


def test_a_candidate_slow_in_a_noisy_spell_is_judged_by_its_steady_measurement(tasks, tmp_path):
    """The fastest candidate, first measured while the machine was busy (4x and spread), is
    measured again steadily and becomes the best at its steady time."""
    class Spell(FakeMeasure):
        def __call__(self, task, results):
            out = super().__call__(task, results)
            if self.calls != 2:
                return out
            self.fast = candidate_key([[l, k] for l, k in results[0].choices])
            return [([2.0, 3.0, 2.0], None)] + out[1:]

        def time_of(self, result):
            key = candidate_key([[l, k] for l, k in result.choices])
            return 0.5 if key == getattr(self, "fast", None) else super().time_of(result)

    db = TuningDatabase(tmp_path / "db.jsonl")
    task = next(t for t in tasks if "softmax" in t.name)
    summary = Tuner([task], db, Spell(), TuneOptions(trials=9, batch=8, verify=False), progress=lambda s: None).tune()
    o = summary.outcomes[0]
    assert o.remeasured == 1
    assert o.best_ms == 0.5  # pooled with the noisy record: 1.25, the median of 2, 3, 2, .5, .5, .5
    assert pooled_best(db.records(task.key, task.target))[1] == 0.5  # what compile(tuning_db=) applies


def test_features_are_relative_to_the_machine(tasks):
    from dataclasses import replace

    task = next(t for t in tasks if "softmax" in t.name)
    base = replace(task.machine, l1_bytes=32 << 10, l2_bytes=1 << 20, l3_bytes=32 << 20)
    bigger = replace(base, l1_bytes=64 << 10, l2_bytes=2 << 20, l3_bytes=64 << 20)
    cache_relative = {"panel_l1", "rows_l1", "chunk_l2", "chunk_l1", "bytes_l3", "a_block_l2"}
    for _, result in enumerate_space(task.func, task.machine)[::7][:8]:
        a = dict(zip(NAMES, candidate_features(result, base)))
        b = dict(zip(NAMES, candidate_features(result, bigger)))
        for name in NAMES:  # what the caches do not change, they do not change
            if name not in cache_relative:
                assert a[name] == b[name], name
        assert b["chunk_l2"] == pytest.approx(a["chunk_l2"] / 2)  # twice the cache: half the share
        assert b["bytes_l3"] < a["bytes_l3"] and b["chunk_l1"] < a["chunk_l1"]
        # a machine with twice the lanes: the same vectors fill half as many of them
        wide = dict(zip(NAMES, candidate_features(result, replace(base, vector_bytes=base.vector_bytes * 2))))
        assert wide["vector_over_lanes"] == pytest.approx(a["vector_over_lanes"] - a["vector_share"])
        assert wide["log_vector"] == a["log_vector"] and wide["split_waste"] == a["split_waste"]


def test_the_register_tiles_fill_is_over_the_machines_register_file():
    # a 1024 x 256 x 1024 matmul's default tiles: AVX-512, 8 rows x 32 floats = 1 KiB of 32 x 64 B;
    # AVX2, 4 rows x 16 floats = 256 B of 16 x 32 B: half the register file on both
    import tvm
    from tvm import te

    from schedules import Machine, schedule_kernel

    A, B = te.placeholder((1024, 256), "float32", name="A"), te.placeholder((256, 1024), "float32", name="B")
    k = te.reduce_axis((0, 256), name="k")
    func = te.create_prim_func([A, B, te.compute((1024, 1024), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k))])
    for mcpu in ("skylake-avx512", "znver3"):
        machine = Machine.for_target(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
        feats = dict(zip(NAMES, candidate_features(schedule_kernel(func, machine), machine)))
        assert feats["reg_fill"] == pytest.approx(0.5), mcpu


@pytest.mark.parametrize("lead, applied", [(0.01, False), (0.10, True)])
def test_a_record_replaces_the_heuristic_only_when_it_is_clearly_faster(tasks, tmp_path, lead, applied):
    from schedules.database import TuningRecord
    from schedules.history import ApplyHistoryBest

    task = next(t for t in tasks if "softmax" in t.name)
    heur = heuristic_candidate(task.func, task.machine, task.fuse_epilogue)
    other = next(c for c, _ in enumerate_space(task.func, task.machine) if candidate_key(c) != candidate_key(heur))
    db = TuningDatabase(tmp_path / "db.jsonl")
    for c, ms in [(heur, 1.0), (other, 1.0 - lead)]:
        db.append(TuningRecord(task=task.key, target=task.target, candidate={"steps": c}, times_ms=[ms] * 3))
    history = ApplyHistoryBest(db, task.target)
    assert history.lookup(task.func) == other  # the best, when nothing says what the heuristic took
    assert (history.lookup(task.func, heur) == other) is applied


def test_the_model_check_leaves_out_records_that_make_the_model_slower_as_called(tasks, tmp_path):
    """tune's last step times the model built with its database and without it as users call
    it; where the database's build is slower, compile does not use it (and logs why), and the
    latest check decides. The times come from a given timer: 2 ms tuned, 1 ms untuned, then
    the other way round."""
    from tvm_ext.tuning import check_model

    db = TuningDatabase(tmp_path / "db.jsonl")
    measure = FakeMeasure()
    measure.time_of = lambda r: 0.1 if "parallel_only" in r.policy else 1.0
    Tuner(tasks, db, measure, TuneOptions(trials=40, batch=8), progress=lambda s: None).tune()

    def tuned_kernels(compiled) -> list[str]:
        return [k.name for k in compiled.report().kernels if "[tuned]" in k.schedule]

    assert tuned_kernels(tvm_ext.compile(_model(), tuning_db=db))  # no check yet: the records apply

    def timer(slower_when_tuned: bool):
        return lambda model, inputs: (2.0 if bool(tuned_kernels(model)) == slower_when_tuned else 1.0)

    assert check_model(_model(), db, timer=timer(True), rounds=3) == (2.0, 1.0)
    compiled = tvm_ext.compile(_model(), tuning_db=db)
    assert tuned_kernels(compiled) == []
    (note,) = [d for d in compiled.report().decisions if d.action == "tuning"]
    assert "2.000 ms with it and 1.000 ms without" in note.reason
    x = np.random.default_rng(0).standard_normal((6, 40)).astype("float32")
    np.testing.assert_allclose(compiled(x), tvm_ext.compile(_model())(x), rtol=1e-5, atol=1e-6)

    assert check_model(_model(), db, timer=timer(False), rounds=3) == (1.0, 2.0)  # the latest check decides
    assert tuned_kernels(tvm_ext.compile(_model(), tuning_db=db))
    assert len([r for r in db.records() if r.task.startswith("model:")]) == 4
