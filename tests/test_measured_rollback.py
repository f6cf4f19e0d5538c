"""Rollback by measurement: AutoFuse splits a kernel its judge finds slower than its parts
(decisions worked out by hand with a judge that answers given times), the real judge on a
kernel built to be slower fused (an expensive value recomputed under two index maps), and
the decisions a tuning database keeps for the next compile."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import tvm_ext
from conftest import build_module
from relay_passes import DataflowGraph
from relay_passes.autofuse import AutoFuse, RollbackVerdict
from schedules.database import TuningDatabase
from tvm_ext.measured_rollback import standalone_module

R = relax.op


def _two_kernels(x, y):
    bb = relax.BlockBuilder.current()
    a = bb.emit(R.nn.relu(R.exp(x)), "a")  # kernel 1: exp, relu
    s = bb.emit(R.sum(y, axis=[1], keepdims=True), "s")  # kernel 2: sum, divide
    return R.add(a, bb.emit(R.divide(y, s), "d"))


def _kernels(graph, part):
    return [[graph[n].name for n in g.nodes if graph[n].kind == "op"] for g in part.groups]


def test_a_judge_splits_exactly_the_kernels_it_finds_slower_than_their_parts():
    mod = build_module(_two_kernels, [((4, 8), "float32")] * 2)
    graph = DataflowGraph(mod["main"].body.blocks[0])
    assert _kernels(graph, AutoFuse()(graph)) == [["lv", "a", "s", "d", "gv"]]  # one kernel unjudged
    seen = []

    def judge(g, group):
        seen.append([g[n].name for n in group.nodes if g[n].kind == "op"])
        return RollbackVerdict(fused_ms=2.0, parts_ms=1.0)  # fused 2x slower

    af = AutoFuse(judge=judge)
    part = af(graph)
    assert seen == [["lv", "a", "s", "d", "gv"]]
    assert _kernels(graph, part) == [["lv"], ["a"], ["s"], ["d"], ["gv"]]
    assert {d.reason for d in part.decisions if d.action == "rollback"} == {
        "rollback:measured 2.0x slower (2.000 ms fused, 1.000 ms apart)"}
    # within the margin (10%) the kernel stays fused, and the log says what was measured
    part = AutoFuse(judge=lambda g, group: RollbackVerdict(1.05, 1.0))(graph)
    assert _kernels(graph, part) == [["lv", "a", "s", "d", "gv"]]
    assert [d.reason for d in part.decisions if d.action == "keep"] == [
        "rollback: measured: fused 1.05x the time of its parts (1.050 ms, 1.000 ms apart)"]
    part = AutoFuse(judge=lambda g, group: None)(graph)  # a judge that cannot tell keeps it
    assert _kernels(graph, part) == [["lv", "a", "s", "d", "gv"]]


def test_the_standalone_module_of_a_group_computes_the_group():
    mod = build_module(_two_kernels, [((4, 8), "float32")] * 2)
    graph = DataflowGraph(mod["main"].body.blocks[0])
    group = AutoFuse()(graph).groups[0]
    alone = standalone_module(graph, group)
    assert [p.name for p in alone["main"].params] == ["x0", "x1"]
    x, y = np.random.default_rng(0).uniform(0.5, 2, (2, 4, 8)).astype("float32")
    np.testing.assert_allclose(tvm_ext.compile(alone)(x, y), np.maximum(np.exp(x), 0) + y / y.sum(1, keepdims=True),
                               rtol=1e-5)


def _recomputed(x):
    # v costs 12 transcendental ops an element; v + v^T inlines v under two index maps, so
    # the fused kernel computes it twice, while apart it is computed once and read twice
    bb = relax.BlockBuilder.current()
    v = x
    for _ in range(6):
        v = bb.emit(R.sin(R.cos(v)))
    return R.add(v, R.permute_dims(v, [1, 0]))


def _reference(x):
    v = x.astype("float64")
    for _ in range(6):
        v = np.sin(np.cos(v))
    return (v + v.T).astype("float32")


def test_measured_rollback_splits_a_kernel_that_recomputes_an_expensive_value(tmp_path):
    mod = build_module(_recomputed, [((512, 512), "float32")])
    x = np.random.default_rng(0).standard_normal((512, 512)).astype("float32")
    counted = tvm_ext.compile(mod)
    assert counted.report().num_kernels == 1  # the seed's count rule keeps the 14-op kernel
    lines = []
    db = TuningDatabase(tmp_path / "db.jsonl")
    measured = tvm_ext.compile(mod, rollback="measure", tuning_db=db, progress=lines.append)
    rolled = [d for d in measured.report().decisions if d.action == "rollback"]
    assert len(rolled) == 14 and rolled[0].reason.startswith("rollback:measured ")
    ratio = float(rolled[0].reason.split()[1].rstrip("x"))
    assert ratio > 1.1  # the fused kernel was measured slower than its parts (2.2x on a Xeon)
    assert measured.report().num_kernels == 14
    assert len(lines) == 1 and lines[0].startswith("rollback: kernel of ")
    np.testing.assert_allclose(measured(x), _reference(x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(counted(x), _reference(x), rtol=1e-4, atol=1e-5)
    # the database keeps both times: the next compile with it splits the same kernel unmeasured
    assert sorted(r.candidate["rollback"] for r in db.records()) == ["fused", "parts"]
    again_lines = []
    again = tvm_ext.compile(mod, tuning_db=tmp_path / "db.jsonl", progress=again_lines.append)
    assert again.report().num_kernels == 14 and again_lines == []
    assert {d.reason.split()[0] for d in again.report().decisions if d.action == "rollback"} == {
        "rollback:recorded"}


def test_rollback_choices_are_checked():
    mod = build_module(lambda x: R.nn.relu(R.exp(x)), [((4, 8), "float32")])
    with pytest.raises(ValueError, match="unknown rollback 'always'"):
        tvm_ext.compile(mod, rollback="always")
    with pytest.raises(ValueError, match="needs fusion='autofuse'"):
        tvm_ext.compile(mod, fusion="nnvm", rollback="measure")
