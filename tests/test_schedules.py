"""The default schedule: which plan each block gets, what it does to the loops, and that
scheduled kernels compute what unscheduled ones do on awkward shapes."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, te

from conftest import build_module
from schedules import ScheduleConfig, block_kind, schedule_prim_func
from tvm_ext import compile as tvm_ext_compile

R = relax.op


def _func(*tensors):
    return te.create_prim_func(list(tensors))


def _kinds(func):
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    return {sch.get(b).name_hint: block_kind(sch, sch.get(b).name_hint)
            for b in sch.get_child_blocks(sch.get_sblock("root"))}


def test_block_kinds_from_access_patterns():
    A = te.placeholder((64, 32), "float32", name="A")
    B = te.placeholder((32, 48), "float32", name="B")
    k = te.reduce_axis((0, 32), name="k")
    mm = te.compute((64, 48), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="mm")
    k2 = te.reduce_axis((0, 32), name="k2")
    rows = te.compute((64,), lambda i: te.sum(A[i, k2], axis=k2), name="rows")
    k3 = te.reduce_axis((0, 64), name="k3")
    cols = te.compute((32,), lambda j: te.sum(A[k3, j], axis=k3), name="cols")
    ew = te.compute((64, 32), lambda i, j: A[i, j] * 2, name="ew")
    assert _kinds(_func(A, B, mm, rows, cols, ew)) == {
        "mm": "anchor", "rows": "row_reduce", "cols": "anchor", "ew": "pointwise"}


def _script(func):
    return tvm.IRModule({"main": func}).script()


def test_pointwise_plan_parallelizes_and_vectorizes():
    A = te.placeholder((256, 1024), "float32", name="A")
    C = te.compute((256, 1024), lambda i, j: A[i, j] + 1, name="C")
    func, plans = schedule_prim_func(_func(A, C), ScheduleConfig(cores=2, vector_bytes=64))
    assert plans == {"C": "pointwise"}
    text = _script(func)
    assert "T.parallel" in text and "T.vectorized(16)" in text


def test_small_kernels_stay_serial():
    A = te.placeholder((4, 16), "float32", name="A")
    C = te.compute((4, 16), lambda i, j: A[i, j] + 1, name="C")
    func, _ = schedule_prim_func(_func(A, C), ScheduleConfig(cores=2, vector_bytes=64))
    assert "T.parallel" not in _script(func)


def test_row_reduce_plan_uses_rfactor_and_a_vector_accumulator():
    A = te.placeholder((128, 1024), "float32", name="A")
    k = te.reduce_axis((0, 1024), name="k")
    S = te.compute((128,), lambda i: te.sum(A[i, k], axis=k), name="S")
    func, plans = schedule_prim_func(_func(A, S), ScheduleConfig(cores=2, vector_bytes=64))
    assert plans == {"S": "row_reduce"}
    text = _script(func)
    assert "S_rf" in text and "T.vectorized(16)" in text and "T.parallel" in text


def test_short_rows_fall_back_to_the_parallel_plan():
    A = te.placeholder((4096, 8), "float32", name="A")
    k = te.reduce_axis((0, 8), name="k")
    S = te.compute((4096,), lambda i: te.max(A[i, k], axis=k), name="S")
    _, plans = schedule_prim_func(_func(A, S), ScheduleConfig(cores=2, vector_bytes=64))
    assert plans == {"S": "parallel_only"}


def test_anchor_plan_tiles_matmul_with_a_cached_accumulator():
    A = te.placeholder((128, 64), "float32", name="A")
    B = te.placeholder((64, 96), "float32", name="B")
    k = te.reduce_axis((0, 64), name="k")
    C = te.compute((128, 96), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    func, plans = schedule_prim_func(_func(A, B, C), ScheduleConfig(cores=2, vector_bytes=64))
    assert plans == {"C": "anchor"}
    text = _script(func)
    assert "C_global" in text and "T.vectorized(32)" in text and "C_init" in text


AWKWARD = [
    ("matmul 37x53x29", lambda a, b: R.matmul(a, b), [(37, 53), (53, 29)]),
    ("softmax 7x999", lambda a: R.nn.softmax(a, axis=-1), [(7, 999)]),
    ("layer_norm 33x1000", lambda a: R.nn.layer_norm(a, relax.const(np.ones(1000, "float32")),
                                                      relax.const(np.zeros(1000, "float32")), axes=[-1]),
     [(33, 1000)]),
    ("elementwise 1001x3", lambda a: R.exp(R.multiply(a, a)), [(1001, 3)]),
    ("conv2d 1x5x13x17", lambda a, w: R.nn.conv2d(a, w, padding=1), [(1, 5, 13, 17), (7, 5, 3, 3)]),
    ("column mean 4099x33", lambda a: R.mean(a, axis=[0]), [(4099, 33)]),
]


@pytest.mark.parametrize("name,make,shapes", AWKWARD, ids=[a[0] for a in AWKWARD])
def test_scheduled_equals_unscheduled(name, make, shapes):
    from tvm_ext.pipeline import Pipeline

    mod = build_module(make, [(s, "float32") for s in shapes])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype("float32") for s in shapes]
    scheduled = Pipeline(strict=True).run(mod)
    plain = Pipeline(strict=True, schedule=False).run(mod)
    assert any(k.schedule for k in scheduled.report().kernels)
    np.testing.assert_allclose(scheduled(*inputs), plain(*inputs), rtol=2e-5, atol=2e-5)


def test_schedule_is_recorded_in_the_report():
    mod = build_module(lambda a, b: R.matmul(a, b), [((64, 64), "float32"), ((64, 64), "float32")])
    (kernel,) = tvm_ext_compile(mod).report().kernels
    assert kernel.schedule == "gv:anchor"


def test_normalizations_run_row_by_row_in_one_loop_nest():
    mod = build_module(lambda a: R.nn.softmax(a, axis=-1), [((64, 512), "float32")])
    compiled = tvm_ext_compile(mod)
    (kernel,) = compiled.report().kernels
    assert set(p.split(":")[1] for p in kernel.schedule.split(", ")) == {"persistent_rows"}
    text = compiled.lowered_module.script()
    assert text.count("T.parallel") == 1  # one row loop holds every stage
    x = np.random.default_rng(0).standard_normal((64, 512)).astype("float32")
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(compiled(x), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
