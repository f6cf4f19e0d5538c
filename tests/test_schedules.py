"""ImplGraph schedules: the axis rules (the seed's examples), every policy against the
unscheduled kernel on awkward shapes, and the heuristic's choices."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
import tvm
import tvm_ffi
from tvm import relax, te

import tvm_ext
from conftest import another_mcpu, build_module
from schedules import AxisRuleError, AxisType, ImplGraph, Machine, ScheduleBuilder, block_infos, schedule_kernel
from schedules.policies import (POLICIES, Keep2D, MergeAllBlockVectorize, ParallelOnly, PersistentRows, Policy,
                                ReadTile, RegisterTiledAnchor, RowPerCore, SplitReduction, TransposeTile)
from schedules.search_space import apply_candidate
from tvm_ext.target import cpu_target

R = relax.op
MACHINE = Machine(cores=2, vector_bytes=64)


# --------------------------------------------------------------------------- the axis model
def test_split_names_types_and_sizes_follow_the_seed():
    g = ImplGraph.of_block("B", [100, 24])
    g.block_split("z0", 25)
    g.tile_split("z1", 8)
    assert g.names == ["z0B", "z0b", "z1T", "z1t"]
    z0B, z0b, z1T = g["z0B"], g["z0b"], g["z1T"]
    assert (z0B.type, z0B.size, z0B.size_expr, z0B.from_, z0B.split_pair) == \
        (AxisType.BLOCK_OUTER, 4, "ceil(s0/s0b)", ("z0",), "z0b")
    assert (z0b.type, z0b.size, z0b.size_expr) == (AxisType.BLOCK_INNER, 25, "s0b")
    assert (z1T.type, z1T.size, z1T.size_expr) == (AxisType.TILE_OUTER, 3, "ceil(s1/s1t)")


def test_at_most_one_block_outer_axis():
    g = ImplGraph.of_block("B", [8, 8])
    g.block_split("z0", 2)
    with pytest.raises(AxisRuleError, match="at most one block-outer axis"):
        g.block_split("z1", 2)


def test_consecutive_axes_merge():
    # seed: sched.axis = [z0, z1, z2, z3]: [z1, z2, z3] are consecutive
    g = ImplGraph.of_block("B", [2, 3, 4, 5])
    merged = g.merge("z1", "z2", "z3")
    assert g.names == ["z0", merged] and g[merged].type is AxisType.MERGED and g[merged].size == 60
    assert g[merged].from_ == ("z1", "z2", "z3") and g[merged].size_expr == "s1*s2*s3"
    with pytest.raises(AxisRuleError, match="only consecutive axes"):
        ImplGraph.of_block("B", [2, 3, 4]).merge("z0", "z2")


def test_no_vector_wider_than_four_avx512_registers():
    # the stop rule for LLVM's time: a vector of 512 floats (a schedule bug) took 48 s to compile
    from schedules.axes import MAX_VECTOR_LANES
    g = ImplGraph.of_block("B", [4, 2 * MAX_VECTOR_LANES])
    g.tile_split("z1", MAX_VECTOR_LANES)
    g.mark_vectorized("z1t")
    with pytest.raises(AxisRuleError, match="vector of 128 lanes"):
        ImplGraph.of_block("B", [4, 2 * MAX_VECTOR_LANES]).mark_vectorized("z1")


def test_split_axes_are_consecutive_with_their_neighbours():
    # seed: [z0, z1T, z1t, z2T, z2t, z3]: [z1t, z2T] are consecutive
    g = ImplGraph.of_block("B", [2, 8, 8, 2])
    g.tile_split("z1", 4)
    g.tile_split("z2", 2)
    assert g.names == ["z0", "z1T", "z1t", "z2T", "z2t", "z3"]
    assert g[g.merge("z1t", "z2T")].size == 16


def test_reordered_original_axes_are_consecutive_in_their_new_order():
    # seed: reordered to [z0, z2, z1, z3]: [z0, z2] are consecutive
    g = ImplGraph.of_block("B", [2, 3, 4, 5])
    g.reorder("z2", "z1")
    assert g.names == ["z0", "z2", "z1", "z3"]
    assert g[g.merge("z0", "z2")].size == 8


def test_a_split_axis_that_was_reordered_cannot_merge():
    # seed: z1 split, then [z0, z1T, z2, z1t, z3]: [z2, z1t] and [z1t, z3] cannot merge, [z0, z1T] can
    g = ImplGraph.of_block("B", [2, 8, 4, 5])
    g.tile_split("z1", 2)
    g.reorder("z2", "z1t")
    assert g.names == ["z0", "z1T", "z2", "z1t", "z3"]
    for pair in (("z2", "z1t"), ("z1t", "z3")):
        with pytest.raises(AxisRuleError, match="z1t was split and then reordered"):
            g.merge(*pair)
    assert g[g.merge("z0", "z1T")].size == 8


def test_loop_axis_and_vectorized_fields_of_the_seeds_example():
    # the seed: four axes; the loop stops at z1, the buffer is allocated under q0, so each step
    # computes z2 x z3 and the buffer spans z1, z2, z3 with strides [s2*s3, s3, 1]
    g = ImplGraph.of_block("B", [2, 3, 4, 5])
    g.set_loop_axis("z1")
    g.set_buffer_axis("z0")
    assert g.names == ["z0", "z1", "z2", "z3"] and g.loop_axis == "z1"
    assert g.computed_axis == ["z2", "z3"]
    assert g.vectorized_axis == ["z1", "z2", "z3"] and g.vectorized_stride == [20, 5, 1]
    assert g.vectorized_stride_expr == ["s2*s3", "s3", "1"]
    table = g.table()
    assert "sched.loop_axis = z1" in table and "vectorized_stride = [s2*s3, s3, 1] = [20, 5, 1]" in table
    with pytest.raises(AxisRuleError, match="below the loop axis z1"):
        g.set_buffer_axis("z2")
    # by default the buffer holds one step's data (what a vectorized CPU loop writes)
    h = ImplGraph.of_block("B", [2, 3, 4, 5])
    h.set_loop_axis("z1")
    assert h.vectorized_axis == h.computed_axis == ["z2", "z3"] and h.vectorized_stride == [5, 1]


# --------------------------------------------------------------------------- policies
def _pointwise(shape):
    A = te.placeholder(shape, "float32", name="A")
    B = te.compute(shape, lambda *i: te.exp(A(*i)) * 2.0, name="B")
    return te.create_prim_func([A, B])


def _transpose(n, m):
    A = te.placeholder((n, m), "float32", name="A")
    return te.create_prim_func([A, te.compute((m, n), lambda i, j: A[j, i] + 1.0, name="T")])


def _row_sum(rows, cols):
    A = te.placeholder((rows, cols), "float32", name="A")
    k = te.reduce_axis((0, cols), name="k")
    return te.create_prim_func([A, te.compute((rows,), lambda i: te.sum(A[i, k], axis=k), name="S")])


def _matmul(m, k_, n, epilogue=False):
    A = te.placeholder((m, k_), "float32", name="A")
    B = te.placeholder((k_, n), "float32", name="B")
    k = te.reduce_axis((0, k_), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    if epilogue:
        D = te.compute((m, n), lambda i, j: te.max(C[i, j], tvm.tirx.const(0.0, "float32")), name="D")
        return te.create_prim_func([A, B, D])
    return te.create_prim_func([A, B, C])


def _row_kernel(op, rows, cols):
    """The one unscheduled kernel our pipeline makes of ``op(x)`` for x of (rows, cols)."""
    mod = build_module(op, [((rows, cols), "float32")])
    pipe = tvm_ext.Pipeline(schedule=False)
    lowered, _ = pipe.lower(pipe.prepare(mod))
    return next(f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc))


def _softmax(rows, cols):
    return _row_kernel(lambda x: R.nn.softmax(x, axis=-1), rows, cols)


def _unblock(blocks, block, h, w):
    """NCHW[block]c -> NCHW, times 2: a transpose whose reads run along the channels."""
    A = te.placeholder((1, blocks, h, w, block), "float32", name="A")
    return te.create_prim_func([A, te.compute((1, blocks * block, h, w), lambda n, c, y, x: A[
        n, c // block, y, x, c % block] * 2.0, name="B")])


def _blocked_conv(blocks, h, w, block=16, k=3):
    """A 3x3 convolution in NCHW[block]c x OIHW[block]i[block]o, padded input given."""
    X = te.placeholder((1, blocks, h + k - 1, w + k - 1, block), "float32", name="X")
    W = te.placeholder((blocks, blocks, k, k, block, block), "float32", name="W")
    ic, kh, kw, ib = (te.reduce_axis((0, blocks), "ic"), te.reduce_axis((0, k), "kh"), te.reduce_axis((0, k), "kw"),
                      te.reduce_axis((0, block), "ib"))
    return te.create_prim_func([X, W, te.compute((1, blocks, h, w, block), lambda n, oc, y, x, ob: te.sum(
        X[n, ic, y + kh, x + kw, ib] * W[oc, ic, kh, kw, ib, ob], axis=[ic, kh, kw, ib]), name="Y")])


def _padded_conv_tensors(blocks, h, w, block=16):
    """X (unpadded, NCHW[block]c), W and Y of a 3x3 convolution whose padding is a stage of
    the kernel, as our lowering of a padded convolution makes it."""
    X = te.placeholder((1, blocks, h, w, block), "float32", name="X")
    P = te.compute((1, blocks, h + 2, w + 2, block), lambda n, c, y, x, b: tvm.tirx.if_then_else(
        tvm.tirx.all(y >= 1, y <= h, x >= 1, x <= w), X[n, c, y - 1, x - 1, b], tvm.tirx.const(0.0, "float32")),
        name="P")
    W = te.placeholder((blocks, blocks, 3, 3, block, block), "float32", name="W")
    ic, kh, kw, ib = (te.reduce_axis((0, blocks), "ic"), te.reduce_axis((0, 3), "kh"), te.reduce_axis((0, 3), "kw"),
                      te.reduce_axis((0, block), "ib"))
    Y = te.compute((1, blocks, h, w, block), lambda n, oc, y, x, ob: te.sum(
        P[n, ic, y + kh, x + kw, ib] * W[oc, ic, kh, kw, ib, ob], axis=[ic, kh, kw, ib]), name="Y")
    return X, W, Y


def _padded_conv(blocks, h, w, block=16):
    """``_blocked_conv`` on an unpadded input: the kernel pads it in a stage of its own."""
    return te.create_prim_func(list(_padded_conv_tensors(blocks, h, w, block)))


def _conv_back_to_nchw(blocks, h, w, block=16):
    """``_padded_conv`` whose epilogue writes NCHW: relu(y * scale + shift) + a residual, as a
    blocked convolution's last kernel converts back."""
    X, W, Y = _padded_conv_tensors(blocks, h, w, block)
    S, B = te.placeholder((blocks * block,), "float32", name="S"), te.placeholder((blocks * block,), "float32", name="B")
    R = te.placeholder((1, blocks * block, h, w), "float32", name="R")
    out = te.compute((1, blocks * block, h, w), lambda n, c, y, x: te.max(
        Y[n, c // block, y, x, c % block] * S[c] + B[c], tvm.tirx.const(0.0, "float32")) + R[n, c, y, x], name="O")
    return te.create_prim_func([X, W, S, B, R, out])


def _staged_matmul(m, k_, n, operand):
    """``_matmul`` whose operand ``operand`` ("A" or "B") is first doubled in a stage of its own."""
    A = te.placeholder((m, k_), "float32", name="A")
    B = te.placeholder((k_, n), "float32", name="B")
    if operand == "A":
        A = te.compute((m, k_), lambda i, k: A[i, k] * 2.0, name="S")
    else:
        B = te.compute((k_, n), lambda k, j: B[k, j] * 2.0, name="S")
    k = te.reduce_axis((0, k_), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return te.create_prim_func([A.op.input_tensors[0] if operand == "A" else A,
                                B.op.input_tensors[0] if operand == "B" else B, C])


def _run(func, inputs, out_shapes):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), tvm_ext.host_target())
    args = [tvm.runtime.tensor(a) for a in inputs] + [tvm.runtime.empty(s, "float32") for s in out_shapes]
    lib["main"](*args)
    return [a.numpy() for a in args[len(inputs):]]


POLICY_CASES = [
    (MergeAllBlockVectorize, 0, lambda: _pointwise((33, 77))),
    (MergeAllBlockVectorize, 0, lambda: _pointwise((64, 256))),
    (Keep2D, 0, lambda: _pointwise((7, 3, 1000))),
    (Keep2D, 0, lambda: _pointwise((129, 48))),
    (TransposeTile, 0, lambda: _transpose(96, 64)),
    (ReadTile, 0, lambda: _transpose(96, 64)),
    (ReadTile, 0, lambda: _unblock(3, 16, 6, 24)),
    (RegisterTiledAnchor, 0, lambda: _blocked_conv(4, 10, 12)),
    (RegisterTiledAnchor, 1, lambda: _padded_conv(2, 9, 16)),
    (RegisterTiledAnchor, 1, lambda: _conv_back_to_nchw(3, 6, 16)),
    (RowPerCore, 0, lambda: _row_sum(37, 1000)),
    (RowPerCore, 0, lambda: _row_sum(5000, 64)),
    (SplitReduction, 0, lambda: _row_sum(1, 40000)),
    (RegisterTiledAnchor, 0, lambda: _matmul(37, 53, 29)),
    (RegisterTiledAnchor, 0, lambda: _matmul(128, 96, 64)),
    (RegisterTiledAnchor, 0, lambda: _matmul(64, 33, 48, epilogue=True)),
    (PersistentRows, -1, lambda: _softmax(7, 999)),
    (PersistentRows, -1, lambda: _softmax(64, 512)),
    (ParallelOnly, 0, lambda: _row_sum(4096, 8)),
]


@pytest.mark.parametrize("policy_cls,block_index,make", POLICY_CASES,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(POLICY_CASES)])
def test_every_policy_candidate_matches_the_unscheduled_kernel(policy_cls, block_index, make):
    func = make()
    inputs = [np.random.default_rng(i).standard_normal([int(d) for d in p.shape]).astype("float32")
              for i, p in enumerate(func.params[:-1])]
    out_shape = [int(d) for d in func.params[-1].shape]
    (want,) = _run(func, inputs, [out_shape])
    policy = policy_cls(MACHINE)
    info = block_infos(ScheduleBuilder(func).sch)[block_index]
    assert policy.applies(info, ScheduleBuilder(func))
    tried = 0
    for knobs in policy.candidates(info):
        builder = ScheduleBuilder(func)
        try:
            policy.apply(builder, info, knobs)
        except (ValueError, RuntimeError):
            continue  # a candidate TVM rejects is skipped by the heuristic and the tuner too
        (got,) = _run(builder.result("k").func, inputs, [out_shape])
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4, err_msg=str(knobs))
        tried += 1
    assert tried >= 1


def _exp_rows(cols, reversed_read):
    """e = exp(A); s = row sums of e; out = e / s, reading e's row backwards if asked."""
    A = te.placeholder((5, cols), "float32", name="A")
    E = te.compute((5, cols), lambda i, j: te.exp(A[i, j]), name="E")
    k = te.reduce_axis((0, cols), name="k")
    S = te.compute((5, 1), lambda i, _: te.sum(E[i, k], axis=k), name="S")
    out = te.compute((5, cols), lambda i, j: E[i, cols - 1 - j if reversed_read else j] / S[i, 0], name="O")
    return te.create_prim_func([A, out])


@pytest.mark.parametrize("reversed_read", [False, True])
def test_persistent_rows_writes_a_stage_into_the_output_only_when_read_element_by_element(reversed_read):
    # out[i, j] = e[i, j] / s[i]: e's rows can live in the output (no scratch buffer); read
    # backwards, the output would overwrite e[i, cols-1-j] before reading it: keep the scratch
    func = _exp_rows(37, reversed_read)
    a = np.random.default_rng(0).standard_normal((5, 37)).astype("float32")
    e = np.exp(a)
    want = (e[:, ::-1] if reversed_read else e) / e.sum(1, keepdims=True)
    builder = ScheduleBuilder(func)
    assert PersistentRows(MACHINE).applies(block_infos(builder.sch)[-1], builder)
    PersistentRows(MACHINE).apply(builder, block_infos(builder.sch)[-1], {"vector": 16})
    result = builder.result("k")
    scratch = [b.name for b in result.func.body.block.alloc_buffers if [int(d) for d in b.shape] == [5, 37]]
    assert (builder.into_output, scratch) == (([], ["E"]) if reversed_read else ([("E", "O")], []))
    (got,) = _run(result.func, [a], [(5, 37)])
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _vector_extents(func) -> list[int]:
    found = []
    tvm_ffi.structural_walk(func, (tvm.tirx.For, lambda f: found.append(int(f.extent))
                                   if f.kind == tvm.tirx.ForKind.VECTORIZED else None))
    return found


def test_persistent_rows_declines_a_reduction_that_makes_a_whole_row():
    # softmax(q @ k^T): the scores are a reduction of their own whose rows are whole rows, not
    # one statistic each. Taken as a row statistic, their lanes spanned the row (vectors of 512
    # floats for 64 x 64 scores, on which LLVM spent 48 s; 128 x 128: over 500 s)
    n, d = 64, 32
    q, k = te.placeholder((n, d), name="Q"), te.placeholder((n, d), name="K")
    r = te.reduce_axis((0, d), "r")
    scores = te.compute((n, n), lambda i, j: te.sum(q[i, r] * k[j, r], axis=r), name="S")
    c = te.reduce_axis((0, n), "c")
    top = te.compute((n, 1), lambda i, _: te.max(scores[i, c], axis=c), name="M")
    e = te.compute((n, n), lambda i, j: te.exp(scores[i, j] - top[i, 0]), name="E")
    c2 = te.reduce_axis((0, n), "c2")
    total = te.compute((n, 1), lambda i, _: te.sum(e[i, c2], axis=c2), name="Z")
    out = te.compute((n, n), lambda i, j: e[i, j] / total[i, 0], name="O")
    func = te.create_prim_func([q, k, out])
    builder = ScheduleBuilder(func)
    assert not PersistentRows(MACHINE).applies(block_infos(builder.sch)[-1], builder)
    result = schedule_kernel(func, MACHINE)
    assert max(_vector_extents(result.func)) <= 64
    a, b = (np.random.default_rng(i).standard_normal((n, d)).astype("float32") for i in (0, 1))
    (got,) = _run(result.func, [a, b], [(n, n)])
    s_ = a.astype("float64") @ b.T
    want = np.exp(s_ - s_.max(1, keepdims=True))
    np.testing.assert_allclose(got, want / want.sum(1, keepdims=True), rtol=1e-4, atol=1e-7)


def test_a_kernel_with_a_0d_result_keeps_vector_row_reductions():
    # the mean of row sums: its last block, 0-d, has no loop, and TVM's rfactor then failed on
    # every other block of the kernel; the rows were summed one scalar at a time
    a = te.placeholder((64, 1000), name="A")
    k, i = te.reduce_axis((0, 1000), "k"), te.reduce_axis((0, 64), "i")
    rows = te.compute((64, 1), lambda r, _: te.sum(a[r, k], axis=k), name="S")
    total = te.compute((), lambda: te.sum(rows[i, 0], axis=i), name="T")
    mean = te.compute((), lambda: total[()] * (1.0 / 64000), name="U")
    func = te.create_prim_func([a, mean])
    builder = ScheduleBuilder(func)
    info = next(x for x in block_infos(builder.sch) if x.name == "S")
    policy = RowPerCore(MACHINE)
    assert policy.trial(builder, info, policy.default(info)) is not None
    result = schedule_kernel(func, MACHINE)
    assert "row_per_core@S" in [label for label, _ in result.choices]
    x = np.random.default_rng(0).standard_normal((64, 1000)).astype("float32")
    (got,) = _run(result.func, [x], [()])
    np.testing.assert_allclose(got, x.astype("float64").mean(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("prefetch", [0, 1])
def test_persistent_rows_sums_the_stage_as_it_goes_and_prefetches_the_next_row(prefetch):
    # softmax: e = exp(x - max) row by row into the output, its vector partial sums in the same
    # loop; with the knob, each iteration of that loop prefetches the next row of x
    func = _softmax(64, 512)
    builder = ScheduleBuilder(func)
    PersistentRows(MACHINE).apply(builder, block_infos(builder.sch)[-1], {"vector": 16, "prefetch": prefetch})
    result = builder.result("k")
    roles = {g.block: g.role for g in result.groups}
    assert roles["gv_sum_rf_rf_rf_rf"] == "vector partial sums, in the stage loop"
    assert roles["gv_exp"] == "row stage, in the output"
    text = result.script()
    assert text.count("llvm.prefetch") == prefetch
    stage_loop = text.split("with T.sblock(\"gv_max\")")[1].split("with T.sblock(\"gv_exp\")")[0]
    assert ("llvm.prefetch" in stage_loop) == bool(prefetch)
    x = np.random.default_rng(1).standard_normal((64, 512)).astype("float32")
    e = np.exp(x - x.max(1, keepdims=True))
    (got,) = _run(result.func, [x], [(64, 512)])
    np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("accumulators", [1, 4])
def test_persistent_rows_prefetches_every_cache_line_an_iteration_covers(accumulators):
    # log_softmax 8 x 512: the exp is summed in the reduction's own loop, accumulators x 16
    # floats an iteration = accumulators cache lines of the next row, one prefetch each
    func = _row_kernel(lambda x: R.nn.log_softmax(x, axis=-1), 8, 512)
    builder = ScheduleBuilder(func)
    PersistentRows(MACHINE).apply(builder, block_infos(builder.sch)[-1],
                                  {"vector": 16, "prefetch": 1, "accumulators": accumulators})
    result = builder.result("k")
    text = result.script()
    assert text.count("llvm.prefetch") == accumulators
    sum_loop = text.split('with T.sblock("gv_max")')[1].split('with T.sblock("gv_sum_rf_rf_rf")')[0]
    assert sum_loop.count("llvm.prefetch") == accumulators
    x = np.random.default_rng(3).standard_normal((8, 512)).astype("float32") * 4
    (got,) = _run(result.func, [x], [(8, 512)])
    want = x - x.max(1, keepdims=True) - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("accumulators", [1, 4])
def test_persistent_rows_accumulators_widen_the_partial_sums_of_an_input(accumulators):
    # softmax 64 x 512: the max of x keeps accumulators x 16 partial maxima (then combined as
    # vectors into 16 lanes); the sum of the exp stage stays one vector (in the stage's loop).
    # Each sums its 16 lanes in halves (8, 4, 2, then the row's value): one rfactor per binary
    # digit of the lane, each buffer the digits left
    func = _softmax(64, 512)
    builder = ScheduleBuilder(func)
    PersistentRows(MACHINE).apply(builder, block_infos(builder.sch)[-1],
                                  {"vector": 16, "prefetch": 0, "accumulators": accumulators})
    result = builder.result("k")
    lanes = {b.name: [int(d) for d in b.shape[:-2]] for b in result.func.body.block.alloc_buffers
             if b.name.endswith("rf")}
    want = {red + ".rf" * depth: [2] * depth for red in ("gv_max", "gv_sum") for depth in range(1, 5)}
    if accumulators > 1:
        want["gv_max" + ".rf" * 5] = [accumulators, 2, 2, 2, 2]
    assert lanes == want
    text = result.script()
    for red in ("gv_max", "gv_sum"):  # the halves: 8, 4 and 2 lanes a vector, after the 2 they add
        for depth, width in ((3, 8), (2, 4), (1, 2)):
            halves, lanes = text.split(f'with T.sblock("{red}{"_rf" * depth}")')[0].rsplit("for ", 2)[-2:]
            assert halves.startswith("ax0 in T.unroll(2):") and lanes.rstrip().endswith(f"T.vectorized({width}):")
    x = np.random.default_rng(2).standard_normal((64, 512)).astype("float32")
    e = np.exp(x - x.max(1, keepdims=True))
    (got,) = _run(result.func, [x], [(64, 512)])
    np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def _group_norm_silu(shape, groups):
    """The one unscheduled kernel of GroupNorm(groups) + SiLU over x of ``shape`` (NCHW)."""
    c = shape[1]
    mod = build_module(lambda x, g, b: R.nn.silu(R.nn.group_norm(x, g, b, groups, 1, [2, 3])),
                       [(shape, "float32"), ((c,), "float32"), ((c,), "float32")])
    pipe = tvm_ext.Pipeline(schedule=False)
    lowered, _ = pipe.lower(pipe.prepare(mod))
    return next(f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc))


def _group_norm_silu_ref(x, gamma, beta, groups, eps=1e-5):
    g = x.reshape(x.shape[0], groups, -1).astype("float64")
    y = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(x.shape)
    y = y * gamma.reshape(1, -1, 1, 1) + beta.reshape(1, -1, 1, 1)
    return y / (1 + np.exp(-y))


@pytest.mark.parametrize("vector_bytes,shape,groups,width,channel_loop", [
    # 2 x 12 x 16 x 16, 4 groups: 8 rows (n, g) of 3 channels x 256; a channel's 256 take two
    # vectors an iteration (32 lanes with AVX-512, 16 with AVX2), under a loop over its 3 channels
    (64, (2, 12, 16, 16), 4, 32, 3),
    (32, (2, 12, 16, 16), 4, 16, 3),
    # 4 x 48 x 30 x 30, 8 groups: 32 rows of 6 channels x 900; no whole vector divides 900, so
    # 30 lanes (15 with AVX2) in one loop over (channel, vector): 6 x 30 (6 x 60)
    (64, (4, 48, 30, 30), 8, 30, None),
    (32, (4, 48, 30, 30), 8, 15, None),
])
def test_persistent_rows_takes_a_group_norm_one_group_at_a_time(vector_bytes, shape, groups, width, channel_loop):
    """GroupNorm's statistics come from a grouped view (N, G, C/G, H, W), its output pass is on
    (N, C, H, W): the output's channel axis splits into (group, channel in group), and every
    stage then runs under one parallel loop over the N x G groups. A group is read from memory
    once and its other two passes find it in cache (before: three parallel loops over all of x;
    GroupNorm + SiLU over 8 x 320 x 64 x 64, beyond L3, 4.08 -> 3.07 ms on a Zen 4)."""
    machine = Machine(cores=2, vector_bytes=vector_bytes)
    func = _group_norm_silu(shape, groups)
    builder = ScheduleBuilder(func)
    per = shape[1] // groups
    assert PersistentRows(machine).rows(builder) == (2, (1, per))
    result = schedule_kernel(func, machine)
    assert [c.partition("@")[0] for c, _ in result.choices] == ["persistent_rows"]
    root = result.func.body.block.body
    assert isinstance(root, tvm.tirx.For), "every stage under one loop"
    assert int(root.extent) == shape[0] * groups and root.kind == tvm.tirx.ForKind.PARALLEL
    text = result.script()
    assert f"T.vectorized({width})" in text
    hw = shape[2] * shape[3]
    if channel_loop is not None:
        assert f"T.grid({channel_loop}, {hw // width})" in text
    else:
        assert f"in range({per * hw // width}):" in text
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3 + 50).astype("float32")  # a mean far from 0
    gamma, beta = (rng.standard_normal(shape[1]).astype("float32") for _ in range(2))
    (got,) = _run(result.func, [x, gamma, beta], [shape])
    np.testing.assert_allclose(got, _group_norm_silu_ref(x, gamma, beta, groups), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,groups", [((2, 33, 7, 9), 3), ((2, 17, 5, 5), 17), ((2, 17, 6, 6), 1),
                                          ((3, 12, 1, 1), 4), ((2, 8, 1, 33), 4), ((2, 16, 33, 1), 8)])
def test_a_group_norm_of_any_grouping_compiles_group_by_group(shape, groups):
    # odd channel counts, a group a channel (instance norm), one group (layer norm over C, H, W),
    # a 1 x 1 image and axes of 1: the same one loop over the groups, numerics as numpy's
    c = shape[1]
    mod = build_module(lambda x, g, b: R.nn.silu(R.nn.group_norm(x, g, b, groups, 1, [2, 3])),
                       [(shape, "float32"), ((c,), "float32"), ((c,), "float32")])
    compiled = tvm_ext.compile(mod)
    (kernel,) = compiled.report().kernels
    assert {p.split(":")[1] for p in kernel.schedule.split(", ")} == {"persistent_rows"}
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 2 + 10).astype("float32")
    gamma, beta = (rng.standard_normal(c).astype("float32") for _ in range(2))
    np.testing.assert_allclose(compiled(x, gamma, beta), _group_norm_silu_ref(x, gamma, beta, groups),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,out,padded", [
    ((4, 8, 1), (4, 48, 30, 30), (4, 8, 1, 1, 1)),  # x.reshape(N, G, -1).mean(-1, keepdim=True)
    ((4, 48, 1), (4, 48, 30, 30), (4, 48, 1, 1)),  # x.reshape(N, C, -1): an instance norm
    ((4, 48), (4, 48, 30, 30), (4, 48, 1, 1)),  # the same without keepdim
    ((4096,), (4096, 768), (4096, 1)),  # a row mean without keepdim
    ((4, 7, 1), (4, 48, 30, 30), (4, 7, 1)),  # 7 groups of 48 channels: no grouped view
    ((64,), (128, 64), (64,)),  # a column statistic: it does not keep the rows' axis
    ((4, 8, 2), (4, 48, 30, 30), (4, 8, 2)),  # two values a group: not a statistic of it
    ((4, 1, 1, 1), (4, 48, 30, 30), (4, 1, 1, 1)),  # as many axes: left as it is
])
def test_a_statistic_of_a_reshaped_view_is_read_in_the_outputs_axes(shape, out, padded):
    assert PersistentRows._padded(list(shape), list(out)) == list(padded)


class _GroupNormByHand(torch.nn.Module):
    """GroupNorm + SiLU as diffusion code writes it: over a reshaped view (N, G, -1)."""

    def __init__(self, groups):
        super().__init__()
        self.groups = groups

    def forward(self, x):
        g = x.reshape(x.shape[0], self.groups, -1)
        d = g - g.mean(-1, keepdim=True)
        y = d * torch.rsqrt((d * d).mean(-1, keepdim=True) + 1e-5)
        return torch.nn.functional.silu(y).reshape(x.shape)


@pytest.mark.parametrize("mcpu", ["host", "skylake-avx512", "znver3", "x86-64"])
@pytest.mark.parametrize("shape,groups,parallel", [((4, 48, 30, 30), 8, True), ((2, 12, 16, 16), 12, True),
                                                   ((2, 17, 5, 5), 1, False)])  # 850 elements: one core
def test_a_group_norm_written_by_hand_over_a_reshaped_view_runs_group_by_group(shape, groups, parallel, mcpu):
    """Its statistics are (N, G, 1), against an (N, C, H, W) output: read in the output's
    axes, they are the grouped form, and the kernel is one parallel loop over the N x G groups
    (before: a parallel loop over all of x per statistic, then one for the output; 64 x 48 x 72
    x 72, past the L3 of a Zen 4: 8.50 -> 5.24 ms, kernels alone). Built for each target; run
    on the host, against PyTorch."""
    from tvm_ext.frontends import from_torch

    target = tvm_ext.host_target() if mcpu == "host" else cpu_target(mcpu)
    x = torch.from_numpy((np.random.default_rng(0).standard_normal(shape) * 3 + 20).astype("float32"))
    model = _GroupNormByHand(groups)
    compiled = tvm_ext.compile(from_torch(model, (x,)), target=target)
    (kernel,) = compiled.report().kernels
    assert {p.split(":")[1] for p in kernel.schedule.split(", ")} == {"persistent_rows"}
    func = next(f for f in compiled.lowered_module.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    root = func.body.block.body
    assert isinstance(root, tvm.tirx.For) and int(root.extent) == shape[0] * groups, "every stage under one loop"
    assert (root.kind == tvm.tirx.ForKind.PARALLEL) == parallel
    if mcpu == "host":
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(compiled(x.numpy()), want, rtol=1e-4, atol=1e-4)


class _InterleavedGroupMean(torch.nn.Module):
    """x minus the mean of its channel group, where channel c's group is c % 8: the statistic
    is (N, 8), as a group norm's is, but its groups are not runs of the channel axis."""

    def forward(self, x):
        n, c, h, w = x.shape
        g = x.reshape(n, c // 8, 8, h * w)
        return (g - g.mean((1, 3))[:, None, :, None]).reshape(x.shape)


def test_a_statistic_whose_groups_are_not_the_outputs_rows_is_not_taken_row_by_row():
    # read as the grouped form, every row (n, g) would compute all 8 statistics again: 8 x 64 x
    # 32 x 32 took 1.07 ms against 0.048 (Zen 4). PersistentRows declines it: a stage under the
    # output's rows that runs more iterations than it has elements
    from tvm_ext.frontends import from_torch

    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 64, 8, 8)).astype("float32"))
    model = _InterleavedGroupMean()
    compiled = tvm_ext.compile(from_torch(model, (x,)))
    (kernel,) = compiled.report().kernels
    assert "persistent_rows" not in kernel.schedule
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x.numpy()), model(x).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vector_bytes", [64, 32, 16])  # AVX-512, AVX2, SSE
@pytest.mark.parametrize("shape,parallel", [((4096, 512), True), ((256, 1024), True), ((8, 64), False)])
def test_a_column_sum_takes_tiles_of_four_vectors_split_across_the_cores_by_its_work(shape, parallel, vector_bytes):
    # one output row: no batch and no row axis to split, so the tiles along it go to the cores
    # when rows x columns are work enough (8 x 64 is not: parallel_min_elems 4096); its tile,
    # one row, is four vectors wide: four chains of adds
    machine = Machine(cores=2, vector_bytes=vector_bytes)
    func = _row_kernel(lambda x: R.sum(x, axis=[0]), *shape)  # a register tile of one output row
    result = schedule_kernel(func, machine)
    assert [c.partition("@")[0] for c, _ in result.choices][-1] == "register_tile"
    lanes = vector_bytes // 4  # float32
    assert f"T.vectorized({4 * lanes})" in result.script()
    loops = [s for s in _root_statements(result.func) if isinstance(s, tvm.tirx.For)]
    kinds = [(int(f.extent), f.kind == tvm.tirx.ForKind.PARALLEL) for f in loops]
    assert any(par and extent == 2 for extent, par in kinds) == parallel, kinds
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    (got,) = _run(result.func, [x], [(shape[1],)])
    np.testing.assert_allclose(got, x.sum(0), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("l1_bytes,prefetches", [(32 << 10, 1), (4 << 10, 0)])
def test_persistent_rows_prefetches_the_next_row_only_where_two_rows_fit_in_l1(l1_bytes, prefetches):
    # softmax rows of 1024 floats (4 KiB): the next row's prefetches go beside the row being
    # worked on, in L1; with an L1 of 4 KiB they would evict it
    machine = Machine(cores=2, vector_bytes=64, l1_bytes=l1_bytes)
    builder = ScheduleBuilder(_softmax(8, 1024))
    PersistentRows(machine).apply(builder, block_infos(builder.sch)[-1], {"vector": 16, "prefetch": 1})
    assert builder.result("k").script().count("llvm.prefetch") == prefetches


def test_register_tile_i_block_keeps_a_block_of_rows_across_the_j_tiles():
    # 1024 rows over 2 cores, 8-row tiles: 64 i tiles a core, blocked by 16 (128 rows); per k
    # chunk: i block, then j tiles, then the i tiles of the block
    func = _matmul(1024, 256, 48)
    builder = ScheduleBuilder(func)
    info = block_infos(builder.sch)[0]
    knobs = {"tile_j": 16, "tile_i": 8, "k_unroll": 4, "epilogue": False, "k_block": 128, "i_block": 128}
    RegisterTiledAnchor(MACHINE).apply(builder, info, knobs)
    impl = builder.impl("C")
    assert impl.names[:5] == ["z0B", "z2T", "z0bTT", "z1T", "z0bTt"]
    assert (impl["z0bTT"].size, impl["z0bTt"].size) == (4, 16)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1024, 256)).astype("float32"), rng.standard_normal((256, 48)).astype("float32")
    (got,) = _run(builder.result("k").func, [a, b], [(1024, 48)])
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("i_block", [0, 128])
def test_a_register_tiles_initialization_hoisted_above_its_k_chunks_is_one_vectorized_loop(i_block):
    # split into k chunks, the tile's zeros go above the chunks, over all of a core's rows: they
    # are one loop over C in C's order, a vector (tile_j) an iteration, not the tile's unrolled
    # loops (LLVM's code generation slowed down on those stores: 0.2 s for one kernel)
    func = _matmul(1024, 256, 48)
    builder = ScheduleBuilder(func)
    info = block_infos(builder.sch)[0]
    knobs = {"tile_j": 16, "tile_i": 8, "k_unroll": 4, "epilogue": False, "k_block": 128, "i_block": i_block}
    RegisterTiledAnchor(MACHINE).apply(builder, info, knobs)
    sch = builder.sch
    init_loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("C_init"))]
    outer = [loop for loop in init_loops if loop.kind == tvm.tirx.ForKind.PARALLEL]
    inner = init_loops[len(outer):]
    assert len(outer) == 1 and len(inner) == 2
    assert inner[0].kind == tvm.tirx.ForKind.SERIAL and int(inner[0].extent) * 16 == 1024 // 2 * 48
    assert inner[1].kind == tvm.tirx.ForKind.VECTORIZED and int(inner[1].extent) == 16
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1024, 256)).astype("float32"), rng.standard_normal((256, 48)).astype("float32")
    (got,) = _run(builder.result("k").func, [a, b], [(1024, 48)])
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("l2_kib, vector_bytes, k_block", [(2048, 64, 512), (1024, 64, 256), (512, 32, 256)])
def test_register_tile_k_chunk_is_the_longest_whose_b_panel_takes_a_32nd_of_l2(l2_kib, vector_bytes, k_block):
    # 1024 x 1024 x 256: a B panel of all k (1024 x 2 vectors of floats) outgrows L1, so k is
    # chunked; a 512 chunk's panel is 512 x 2*lanes x 4 bytes: 128 KiB with AVX-512, a 16th of
    # 2 MiB; 1 MiB and 512 KiB (AVX2, 64 KiB panels) keep 256
    machine = Machine(cores=2, vector_bytes=vector_bytes, l2_bytes=l2_kib << 10)
    func = _matmul(256, 1024, 256)
    builder = ScheduleBuilder(func)
    info = block_infos(builder.sch)[0]
    knobs = RegisterTiledAnchor(machine).default(info)
    assert knobs["tile_j"] == 2 * vector_bytes // 4
    assert knobs["k_block"] == k_block
    RegisterTiledAnchor(machine).apply(builder, info, knobs)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((256, 1024)).astype("float32"), rng.standard_normal((1024, 256)).astype("float32")
    (got,) = _run(builder.result("k").func, [a, b], [(256, 256)])
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)


def test_prim_calls_the_schedules_primitives_without_the_python_type_check():
    from tvm import s_tir

    from schedules.primitives import prim

    assert prim.split is s_tir.Schedule.split.__wrapped__  # the check is the wrapper
    func = _pointwise((64, 256))
    checked, unchecked = s_tir.Schedule(func), s_tir.Schedule(func)
    for sch, split in ((checked, checked.split), (unchecked, lambda *a: prim.split(unchecked, *a))):
        split(sch.get_loops(sch.get_sblock("B"))[1], [None, 16])
    assert tvm_ffi.structural_equal(checked.mod, unchecked.mod)
    with pytest.raises(TypeError):  # the checked call rejects what the unchecked one would pass on
        checked.split("not a loop", [None, 16])


def test_policies_are_listed():
    assert {p.name for p in POLICIES} == {"persistent_rows", "register_tile", "row_per_core", "split_reduction",
                                          "read_tile", "transpose_tile", "keep_2d", "merge_all", "parallel_only"}


# --------------------------------------------------------------------------- the heuristic
def _choices(func):
    return [p.partition("@")[0] for p, _ in schedule_kernel(func, MACHINE).choices]


def test_heuristic_picks_by_kind_and_shape():
    assert _choices(_pointwise((256, 1024))) == ["keep_2d"]
    assert _choices(_pointwise((4096, 3))) == ["merge_all"]
    assert _choices(_transpose(256, 256)) == ["read_tile"]
    assert _choices(_row_sum(128, 1024)) == ["row_per_core"]
    assert _choices(_row_sum(1, 1 << 16)) == ["split_reduction"]
    assert _choices(_matmul(128, 64, 96)) == ["register_tile"]
    assert _choices(_softmax(64, 512)) == ["persistent_rows"]
    assert _choices(_unblock(2, 16, 8, 24)) == ["read_tile"]


def _lone_stores_per_loop(func: tvm.tirx.PrimFunc, target: tvm.target.Target) -> list[int]:
    """For each innermost loop of ``func`` lowered by our TIR pipeline: how many scalar stores
    its body makes for strided vector stores (LLVM gets one store a lane)."""
    from tvm_ext.tir_pipeline import lowering_passes
    mod = tvm.tirx.transform.BindTarget(target.with_host(target))(tvm.IRModule({"main": func}))
    lowered = tvm.transform.Sequential(lowering_passes({}, cpu_only=True))(mod)
    counts = []

    def strided_lanes(node) -> int:
        index = node.indices[-1]
        if not isinstance(index, tvm.tirx.Ramp):
            return 0
        unit = isinstance(index.stride, tvm.tirx.IntImm) and index.stride.value == 1
        return 0 if unit else index.lanes

    def loop(node):
        loops, lanes = [], []
        tvm_ffi.structural_walk(node.body, (tvm.tirx.For, loops.append))
        if not loops:
            tvm_ffi.structural_walk(node.body, (tvm.tirx.BufferStore, lambda n: lanes.append(strided_lanes(n))))
            counts.append(sum(lanes))
    tvm_ffi.structural_walk(lowered["main"].body, (tvm.tirx.For, loop))
    return counts


@pytest.mark.parametrize("mcpu", ["host", "skylake-avx512", "znver3", "x86-64"])
def test_a_read_tile_leaves_at_most_64_lone_stores_in_a_loop_body(mcpu):
    # LLVM's LoopLoadElimination compares a loop body's stores pairwise: the NCHW16c -> NCHW
    # epilogue with a tile of 8 (128 lone stores) took 127 ms of a 200 ms optimization
    target = tvm_ext.host_target() if mcpu == "host" else tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    machine = Machine.for_target(target)
    func = _unblock(2, 16, 8, 24)
    result = schedule_kernel(func, machine)
    assert [p.partition("@")[0] for p, _ in result.choices] == ["read_tile"]
    counts = _lone_stores_per_loop(result.func, target)
    assert 0 < max(counts) <= 64, counts
    if mcpu == "host":
        x = np.random.default_rng(0).standard_normal((1, 2, 8, 24, 16)).astype("float32")
        (got,) = _run(result.func, [x], [(1, 32, 8, 24)])
        np.testing.assert_allclose(got, x.transpose(0, 1, 4, 2, 3).reshape(1, 32, 8, 24) * 2.0, rtol=1e-6)


@pytest.mark.parametrize("vector_bytes, tile_b", [(64, 2), (32, 1)])
def test_a_blocked_convs_tile_takes_output_channel_blocks_while_the_registers_hold_them(vector_bytes, tile_b):
    # two 16-channel output blocks of 8 columns: 16 zmm accumulators, 2 weight vectors and a
    # broadcast of the 32 AVX-512 registers; with AVX2's 16 a second block would spill
    info = block_infos(ScheduleBuilder(_blocked_conv(4, 10, 16)).sch)[0]
    assert info.kind == "anchor" and info.reuse_axis == 1  # the output-channel blocks: only W reads them
    (choice,) = schedule_kernel(_blocked_conv(4, 10, 16), Machine(cores=2, vector_bytes=vector_bytes)).choices
    assert choice[1]["tile_b"] == tile_b


@pytest.mark.parametrize("cores, rows", [(2, 30), (4, 16)])
def test_a_convs_padding_stage_is_computed_per_core_for_the_rows_its_tiles_read(cores, rows):
    # 56 output rows in blocks of 28 (14): each core pads the 28 + 2 (14 + 2) input rows its
    # 3x3 windows read, 2 blocks x 58 columns x 16 lanes, instead of a half of the channel blocks
    infos = block_infos(ScheduleBuilder(_padded_conv(2, 56, 56)).sch)
    assert [(i.name, i.stages) for i in infos] == [("P", 0), ("Y", 1)]
    assert RegisterTiledAnchor(MACHINE).space(infos[1])["stage"] == [True, False]
    assert RegisterTiledAnchor(MACHINE).space(block_infos(ScheduleBuilder(_matmul(64, 64, 64)).sch)[0])["stage"] == \
        [False]  # nothing to move: one setting, not two that build the same kernel
    result = schedule_kernel(_padded_conv(2, 56, 56), Machine(cores=cores, vector_bytes=64))
    stage = next(g for g in result.groups if g.block == "P")
    assert stage.role == "input stage per core" and "P:input stage per core" in result.summary()
    conv = next(g.impl for g in result.groups if g.block == "Y")
    assert stage.impl.names[0] == conv.parallel
    assert [a.size for a in stage.impl.axis[1:]] == [2, rows, 58, 16]
    assert stage.impl.vectorized_axis == [stage.impl.names[-1]]
    # without the knob (a record from before it), the stage keeps its own schedule
    *before, (label, knobs) = result.choices
    assert label == "register_tile@Y" and knobs["stage"] is True
    alone = apply_candidate(_padded_conv(2, 56, 56), Machine(cores=cores, vector_bytes=64),
                            [list(c) for c in before] + [[label, {k: v for k, v in knobs.items() if k != "stage"}]])
    assert "P:keep_2d" in alone.summary()


def test_an_anchor_takes_a_stage_only_where_each_core_reads_its_own_part():
    # the rows of A split over the cores: each core doubles its half; every core reads all of B,
    # so B's stage stays where it is rather than run twice
    for operand, moved in (("A", True), ("B", False)):
        result = schedule_kernel(_staged_matmul(256, 64, 128, operand), MACHINE)
        stage = next(g for g in result.groups if g.block == "S")
        assert (stage.role == "input stage per core") is moved, operand
        inputs = [np.random.default_rng(i).standard_normal([int(d) for d in p.shape]).astype("float32")
                  for i, p in enumerate(result.func.params[:-1])]
        (got,) = _run(result.func, inputs, [(256, 128)])
        a, b = inputs
        want = (a * 2) @ b if operand == "A" else a @ (b * 2)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


def test_anchor_result_describes_its_groups():
    result = schedule_kernel(_matmul(128, 64, 96, epilogue=True), MACHINE, name="mm_relu")
    text = result.describe()
    assert "[register tile] ImplGraph of C" in text and "[epilogue on the tile] ImplGraph of D" in text
    c = next(g.impl for g in result.groups if g.block == "C")
    assert c.parallel is not None and c[c.parallel].type is AxisType.BLOCK_OUTER
    assert c.vectorized_axis == [c.names[-1]] and c[c.names[-1]].size == 32
    assert "T.parallel" in result.script() and "T.vectorized(32)" in result.script()


def test_small_kernels_stay_serial():
    assert "T.parallel" not in schedule_kernel(_pointwise((4, 16)), MACHINE).script()


def _parallel_host() -> tvm.target.Target:
    """The host, with at least two cores: a one-core machine's kernels have no parallel loop."""
    return tvm_ext.host_target(cores=max(2, len(os.sched_getaffinity(0))))


def test_normalizations_run_row_by_row_in_one_loop_nest():
    mod = build_module(lambda a: R.nn.softmax(a, axis=-1), [((64, 512), "float32")])
    compiled = tvm_ext.compile(mod, target=_parallel_host())
    (kernel,) = compiled.report().kernels
    assert {p.split(":")[1] for p in kernel.schedule.split(", ")} == {"persistent_rows"}
    assert compiled.lowered_module.script().count("T.parallel") == 1  # one row loop holds every stage
    x = np.random.default_rng(0).standard_normal((64, 512)).astype("float32")
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(compiled(x), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


AWKWARD = [
    ("matmul 37x53x29", lambda a, b: R.matmul(a, b), [(37, 53), (53, 29)]),
    ("softmax 7x999", lambda a: R.nn.softmax(a, axis=-1), [(7, 999)]),
    ("layer_norm 33x1000", lambda a: R.nn.layer_norm(a, relax.const(np.ones(1000, "float32")),
                                                      relax.const(np.zeros(1000, "float32")), axes=[-1]),
     [(33, 1000)]),
    ("elementwise 1001x3", lambda a: R.exp(R.multiply(a, a)), [(1001, 3)]),
    ("conv2d 1x5x13x17", lambda a, w: R.nn.conv2d(a, w, padding=1), [(1, 5, 13, 17), (7, 5, 3, 3)]),
    ("column mean 4099x33", lambda a: R.mean(a, axis=[0]), [(4099, 33)]),
    ("transpose 129x65", lambda a: R.add(R.permute_dims(a), relax.const(1.0, "float32")), [(129, 65)]),
]


@pytest.mark.parametrize("name,make,shapes", AWKWARD, ids=[a[0] for a in AWKWARD])
def test_scheduled_model_equals_unscheduled(name, make, shapes):
    mod = build_module(make, [(s, "float32") for s in shapes])
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype("float32") for s in shapes]
    scheduled = tvm_ext.Pipeline(strict=True).run(mod)
    plain = tvm_ext.Pipeline(strict=True, schedule=False).run(mod)
    assert all(k.schedule for k in scheduled.report().kernels)
    np.testing.assert_allclose(scheduled(*inputs), plain(*inputs), rtol=2e-5, atol=2e-5)


def test_schedule_is_recorded_in_the_report():
    mod = build_module(lambda a, b: R.matmul(a, b), [((64, 64), "float32"), ((64, 64), "float32")])
    (kernel,) = tvm_ext.compile(mod).report().kernels
    assert sorted(kernel.schedule.split(", ")) == ["gv:register_tile", "gv_global:write-back of the tile"]


@pytest.mark.parametrize("m,k,n", [(100, 64, 64), (130, 96, 64), (66, 128, 96)])
def test_parallel_anchor_with_uneven_block_split_is_race_free(m, k, n):
    mod = build_module(lambda a, b: R.matmul(a, b), [((m, k), "float32"), ((k, n), "float32")])
    compiled = tvm_ext.compile(mod, target=_parallel_host())
    assert "register_tile" in compiled.report().kernels[0].schedule
    assert "T.parallel" in compiled.lowered_module.script()
    x = np.random.default_rng(0).standard_normal((m, k)).astype("float32")
    y = np.random.default_rng(1).standard_normal((k, n)).astype("float32")
    for _ in range(10):  # a race between the cores would show up as a wrong tile now and then
        np.testing.assert_allclose(compiled(x, y), x @ y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cores, blocks", [(16, 11), (64, 11), (4, 4)])
def test_an_anchor_with_fewer_row_tiles_than_cores_gives_each_tile_a_core(cores, blocks):
    """66 x 128 x 96: 66 rows in register tiles of 6 (at every vector width) make 11 row tiles.
    Built for 16 or 64 cores, each tile is a block of the parallel loop (before, a matmul with
    fewer than cores x 6 rows and no batch axis got no parallel loop); for 4 cores, blocks of
    ceil(66 / 4) = 17 rows rounded up to 18, so 4 blocks."""
    mod = build_module(lambda a, b: R.matmul(a, b), [((66, 128), "float32"), ((128, 96), "float32")])
    compiled = tvm_ext.compile(mod, target=tvm_ext.host_target(cores=cores))
    assert f"T.parallel({blocks})" in compiled.lowered_module.script()
    x = np.random.default_rng(0).standard_normal((66, 128)).astype("float32")
    y = np.random.default_rng(1).standard_normal((128, 96)).astype("float32")
    np.testing.assert_allclose(compiled(x, y), x @ y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("vector_bytes", [64, 32, 16])
def test_a_last_axis_without_a_full_vector_merges_when_every_read_is_at_the_block_index(vector_bytes):
    machine = Machine(cores=2, vector_bytes=vector_bytes)
    lanes = vector_bytes // 4
    shape = (3, 4, lanes + lanes // 2)  # 1.5 vectors a row; 18 vectors in all
    uniform = schedule_kernel(_pointwise(shape), machine)
    assert [p.partition("@")[0] for p, _ in uniform.choices] == ["merge_all"]
    assert uniform.choices[0][1]["vector"] % lanes == 0  # whole vectors, none of 4 lanes
    A = te.placeholder(shape, "float32", name="A")
    b = te.placeholder(shape[-1:], "float32", name="b")
    bias = te.create_prim_func([A, b, te.compute(shape, lambda i, j, k: A[i, j, k] + b[k], name="B")])
    # a broadcast read: merged axes would need a div/mod of the index in every load of b
    assert [p.partition("@")[0] for p, _ in schedule_kernel(bias, machine).choices] == ["keep_2d"]
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    (got,) = _run(uniform.func, [x], [shape])
    np.testing.assert_allclose(got, np.exp(x) * 2.0, rtol=2e-6)


@pytest.mark.parametrize("vector_bytes,lanes_of_900", [(64, 30), (32, 15)])
@pytest.mark.parametrize("shape", [(4, 48, 900), (4, 48, 900, 1)])
def test_a_row_no_whole_vector_divides_takes_the_widest_divisor_up_to_two_vectors(vector_bytes, lanes_of_900,
                                                                                  shape):
    """A per-channel scale over rows of 900 (a group norm's output pass): 900 is no multiple of
    16 or 8 lanes. Its widest divisor up to two vectors is 30 with 16 lanes and 15 with 8, not
    the 4 that divide it (GroupNorm + SiLU over (4, 48, 900): 0.074 -> 0.037 ms, Zen 4). A
    trailing axis of 1 goes with the row (before: the scale read lane by lane, merged axes)."""
    machine = Machine(cores=2, vector_bytes=vector_bytes)
    A = te.placeholder(shape, "float32", name="A")
    b = te.placeholder((48,), "float32", name="b")
    func = te.create_prim_func([A, b, te.compute(shape, lambda n, c, *r: A(n, c, *r) * b[c], name="B")])
    result = schedule_kernel(func, machine)
    (choice, knobs), = result.choices
    assert choice.startswith("keep_2d") and knobs["vector"] == lanes_of_900
    assert f"T.vectorized({lanes_of_900})" in result.script()
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    w = np.random.default_rng(1).standard_normal(48).astype("float32")
    (got,) = _run(result.func, [x, w], [shape])
    np.testing.assert_allclose(got, x * w.reshape((1, 48) + (1,) * (len(shape) - 2)), rtol=1e-6)


@pytest.mark.parametrize("vector_bytes,lanes", [(64, 29), (32, 29), (16, 0)])
def test_a_row_only_a_wider_divisor_divides_takes_it_up_to_four_vectors(vector_bytes, lanes):
    """Rows of 58 (56 padded by one each side): 2 x 29, no divisor of 4 to 16 lanes. AVX-512
    takes 29 lanes (up to two vectors), AVX2 too (up to four: before, it ran one element at a
    time, a reflect pad of 8x64x56x56 1.21 ms against 0.18 now, built for znver3 on a Zen 4);
    SSE's 4 lanes find no divisor up to 16."""
    machine = Machine(cores=2, vector_bytes=vector_bytes)
    A = te.placeholder((8, 58), "float32", name="A")
    b = te.placeholder((8,), "float32", name="b")  # a scale per row: the rows stay rows (keep_2d)
    func = te.create_prim_func([A, b, te.compute((8, 58), lambda i, j: A[i, j] * b[i], name="B")])
    result = schedule_kernel(func, machine)
    (choice, knobs), = result.choices
    assert choice.startswith("keep_2d") and knobs["vector"] == lanes
    assert (f"T.vectorized({lanes})" in result.script()) if lanes else ("T.vectorized" not in result.script())
    x = np.random.default_rng(0).standard_normal((8, 58)).astype("float32")
    w = np.random.default_rng(1).standard_normal(8).astype("float32")
    (got,) = _run(result.func, [x, w], [(8, 58)])
    np.testing.assert_allclose(got, x * w[:, None], rtol=1e-6)


def test_the_host_machine_takes_its_caches_and_model_from_the_os():
    from tvm_ext import host_cpu
    from tvm_ext.machine import is_host

    assert host_cpu._size("48K") == 48 << 10 and host_cpu._size("32M") == 32 << 20 and host_cpu._size("512") == 512
    host = Machine.for_target(tvm_ext.host_target())
    caches = host_cpu.host_caches()
    if caches is not None:  # Linux with sysfs: the machine is sized by it
        assert (host.l1_bytes, host.l2_bytes, host.l3_bytes) == (caches.l1d, caches.l2, caches.l3)
        assert 8 << 10 <= host.l1_bytes < host.l2_bytes <= host.l3_bytes
    assert host.cpu == host_cpu.host_cpu_name()
    assert is_host(tvm_ext.host_target())
    other = tvm.target.Target({"kind": "llvm", "mcpu": another_mcpu()})
    assert not is_host(other) and Machine.for_target(other).cpu == ""  # another CPU: defaults, no name


_V3 = {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma",
       "abm", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@pytest.mark.parametrize("named, flags, want", [
    ("generic", _V4, "x86-64-v4"),  # a CPU this LLVM does not know, with AVX-512: the level
    ("x86-64", _V3, "x86-64-v3"),  # a hypervisor's generic model over an AVX2 CPU
    ("haswell", _V4, "x86-64-v4"),  # a name with narrower vectors than the flags
    ("znver4", _V4, "znver4"),  # the name has the flags' width: it stays (its scheduling model)
    ("znver3", _V3, "znver3"),
    ("x86-64", _V3 - {"fma"}, "x86-64"),  # short of v3; v2 has no wider vectors than x86-64
    ("x86-64", frozenset(), "x86-64"),  # the OS says nothing
])
def test_the_host_cpu_is_the_x86_64_level_of_its_flags_where_llvm_names_narrower_vectors(named, flags, want):
    from tvm_ext.machine import level_for
    assert level_for(named, frozenset(flags)) == want


def test_the_detected_host_cpu_uses_every_vector_width_the_os_reports():
    from tvm_ext.host_cpu import host_cpu_flags
    from tvm_ext.machine import detected_host_mcpu, vector_bytes
    flags = host_cpu_flags()
    width = vector_bytes(tvm.target.Target({"kind": "llvm", "mcpu": detected_host_mcpu()}))
    if flags:  # Linux: /proc/cpuinfo lists the flags
        assert width >= (64 if _V4 <= flags else 32 if _V3 <= flags else 16)


def test_tvm_ext_host_mcpu_names_the_cpu_host_targets_build_for(monkeypatch):
    from tvm_ext.machine import HOST_MCPU_VARIABLE, is_host
    monkeypatch.setenv(HOST_MCPU_VARIABLE, "x86-64")  # SSE2: code every x86-64 CPU runs
    target = tvm_ext.host_target()
    assert str(target.attrs["mcpu"]) == "x86-64" and is_host(target)
    assert Machine.for_target(target).vector_bytes == 16 and Machine.for_target(target).cpu  # the host's caches
    x = np.linspace(-3, 3, 64, dtype="float32").reshape(8, 8)
    compiled = tvm_ext.compile(build_module(lambda a: relax.op.nn.relu(a), [((8, 8), "float32")]))
    assert '"mcpu":"x86-64"' in compiled.target.replace(" ", "")
    np.testing.assert_array_equal(compiled(x), np.maximum(x, 0))
    monkeypatch.setenv(HOST_MCPU_VARIABLE, "bogus")
    with pytest.raises(ValueError, match=f"{HOST_MCPU_VARIABLE}='bogus' is not a CPU LLVM knows"):
        tvm_ext.host_target()


def test_each_policy_declares_its_knobs_once_and_the_features_read_the_declaration():
    from schedules.analysis import BlockInfo
    from schedules.features import _KNOBS
    from schedules.policies import POLICIES

    machine = Machine(cores=2, vector_bytes=64)
    infos = [BlockInfo("b", kind, spatial, reduce, 32) for kind, spatial, reduce in (
        ("pointwise", (64, 128), ()), ("transpose", (64, 128), ()), ("row_reduce", (64, 128), (128,)),
        ("reduce", (), (4096,)), ("anchor", (256, 256), (512,)))]
    for cls in POLICIES:
        policy = cls(machine)
        for info in infos:
            try:
                space = policy.space(info)
            except (IndexError, ValueError, ZeroDivisionError):  # a block of a kind the policy never takes
                continue
            assert set(space) == set(cls.KNOBS), cls.name
            assert set(policy.default(info)) == set(cls.KNOBS), cls.name
    assert set(_KNOBS) == {k for cls in POLICIES for k in cls.KNOBS} and len(_KNOBS) == len(set(_KNOBS))


def _group_sum(n, groups, per, h, w, swap=False):
    """Sums over each group of ``per`` channels x h x w of an NCHW tensor (swap: w before h)."""
    A = te.placeholder((n, groups * per, h, w), "float32", name="A")
    kc, kh, kw = te.reduce_axis((0, per), "kc"), te.reduce_axis((0, h), "kh"), te.reduce_axis((0, w), "kw")
    axes = [kc, kw, kh] if swap else [kc, kh, kw]
    return te.create_prim_func([A, te.compute((n, groups), lambda i, g: te.sum(
        A[i, g * per + kc, kh, kw], axis=axes), name="S")])


def test_row_per_core_splits_a_long_chain_of_adds_into_independent_accumulators():
    """37 rows of 1000: 8 lanes (16 do not divide 1000), 125 vector steps a row, at least 64: up
    to 8 accumulators, of which 5 divide 125; 64 rows of 256: 16 steps of 16 lanes, one chain."""
    long_rows = schedule_kernel(_row_sum(37, 1000), MACHINE)
    (name, knobs), = long_rows.choices
    assert name.startswith("row_per_core") and knobs == {"vector": 8, "accumulators": 8}
    script = long_rows.script()
    assert "T.unroll(5)" in script and "range(25)" in script and "T.vectorized(8)" in script
    a = np.random.default_rng(1).standard_normal((37, 1000)).astype("float32")
    (got,) = _run(long_rows.func, [a], [(37,)])
    np.testing.assert_allclose(got, a.sum(-1), rtol=1e-5, atol=1e-4)
    short_rows = schedule_kernel(_row_sum(64, 256), MACHINE)
    assert short_rows.choices[0][1] == {"vector": 16, "accumulators": 1}
    assert "T.unroll" not in short_rows.script()


def test_reduce_axes_read_as_one_contiguous_run_merge_into_one_vectorized_row():
    # a group norm's statistics: 6 channels x 30 x 30 per group are 5400 floats in a row; 30
    # alone takes no vector, the merged row takes 8 lanes (5400 = 675 x 8); 675 steps are a
    # long chain of adds: at most 8 accumulators, the most that divide 675 = 5 x 135 are 5
    (info,) = block_infos(tvm.s_tir.Schedule(_group_sum(4, 8, 6, 30, 30)))
    assert info.flat_reduce and info.kind == "row_reduce"
    result = schedule_kernel(_group_sum(4, 8, 6, 30, 30), MACHINE)
    assert result.choices[0][0].startswith("row_per_core")
    assert result.choices[0][1]["vector"] == 8 and result.choices[0][1]["accumulators"] == 8
    script = result.script()
    assert "T.vectorized(8)" in script and "T.unroll(5)" in script and "range(135)" in script
    x = np.random.default_rng(0).standard_normal((4, 48, 30, 30)).astype("float32")
    (got,) = _run(result.func, [x], [(4, 8)])
    np.testing.assert_allclose(got, x.reshape(4, 8, -1).sum(-1), rtol=1e-5, atol=1e-4)
    # reduce axes in another order than memory's are not one run: they stay as they are
    (swapped,) = block_infos(tvm.s_tir.Schedule(_group_sum(4, 8, 6, 30, 30, swap=True)))
    assert not swapped.flat_reduce


@pytest.mark.parametrize("vector_bytes,lanes", [(64, 7), (32, 7), (16, 0)])
def test_a_row_no_power_of_two_divides_reduces_in_vectors_of_its_widest_divisor(vector_bytes, lanes):
    """Means over 7 x 7 (a global average pool of 8 x 64 x 7 x 7): one row of 49 floats per
    channel, which no vector of 4, 8 or 16 lanes divides. 7 lanes do, up to 16 or 8 lanes; 4
    lanes leave the rows to parallel_only (before, every width: 36.8 us a pool of 8 x 512
    channels against 12.4 in vectors of 7, Zen 4)."""
    machine = Machine(cores=2, vector_bytes=vector_bytes)
    func = _group_sum(8, 64, 1, 7, 7)
    result = schedule_kernel(func, machine)
    (choice, knobs), *_ = result.choices
    if lanes:
        assert choice.startswith("row_per_core") and knobs["vector"] == lanes
        assert f"T.vectorized({lanes})" in result.script()
    else:
        assert choice.startswith("parallel_only") and "T.vectorized" not in result.script()
    x = np.random.default_rng(0).standard_normal((8, 64, 7, 7)).astype("float32")
    (got,) = _run(result.func, [x], [(8, 64)])
    np.testing.assert_allclose(got, x.sum((2, 3)), rtol=1e-5, atol=1e-5)


def test_reduce_axes_of_extent_one_do_not_hide_the_row():
    # a group norm's statistics over (4, 48, 900, 1) or (4, 48, 30, 30, 1): the last reduce axis
    # is 1 long, its index simplifies to 0, and the block read as no row at all took the scalar
    # fallback (parallel_only; GroupNorm + SiLU 0.25 ms against 0.089 with the row, Zen 4). The
    # axes that count are the 6 x 900 before it: one run of 5400, 8 lanes, 5 chains of adds
    for func, shape in ((_group_sum(4, 8, 6, 900, 1), (4, 48, 900, 1)),
                        (_group_sum_5d(4, 8, 6, 30, 30), (4, 48, 30, 30, 1))):
        (info,) = block_infos(tvm.s_tir.Schedule(func))
        assert info.kind == "row_reduce" and info.flat_reduce, info
        result = schedule_kernel(func, MACHINE)
        assert result.choices[0][0].startswith("row_per_core")
        assert result.choices[0][1] == {"vector": 8, "accumulators": 8}
        x = np.random.default_rng(0).standard_normal(shape).astype("float32")
        (got,) = _run(result.func, [x], [(4, 8)])
        np.testing.assert_allclose(got, x.reshape(4, 8, -1).sum(-1), rtol=1e-5, atol=1e-3)


def _group_sum_5d(n, groups, per, h, w):
    """Sums over each group of an (n, C, h, w, 1) tensor: the last axis, 1 long, reduced too."""
    A = te.placeholder((n, groups * per, h, w, 1), "float32", name="A")
    kc, kh, kw, k1 = (te.reduce_axis((0, e), name) for e, name in ((per, "kc"), (h, "kh"), (w, "kw"), (1, "k1")))
    return te.create_prim_func([A, te.compute((n, groups), lambda i, g: te.sum(
        A[i, g * per + kc, kh, kw, k1], axis=[kc, kh, kw, k1]), name="S")])


def test_a_row_read_through_a_reshape_is_a_row_reduction():
    # (4, 48, 30, 30) summed as (4, 8, 5400): one reduce axis, which no single index walks at
    # unit stride (the last is k % 30), but the flat index is i * 43200 + g * 5400 + k: a row
    A = te.placeholder((4, 48, 30, 30), "float32", name="A")
    k = te.reduce_axis((0, 5400), "k")
    func = te.create_prim_func([A, te.compute((4, 8), lambda i, g: te.sum(
        A[i, g * 6 + k // 900, k % 900 // 30, k % 30], axis=k), name="S")])
    (info,) = block_infos(tvm.s_tir.Schedule(func))
    assert info.kind == "row_reduce" and not info.flat_reduce
    result = schedule_kernel(func, MACHINE)
    assert result.choices[0][0].startswith("row_per_core") and result.choices[0][1]["vector"] == 8
    x = np.random.default_rng(0).standard_normal((4, 48, 30, 30)).astype("float32")
    (got,) = _run(result.func, [x], [(4, 8)])
    np.testing.assert_allclose(got, x.reshape(4, 8, -1).sum(-1), rtol=1e-5, atol=1e-3)


def test_a_value_read_along_the_output_axis_alone_does_not_make_an_anchor():
    # a variance's second pass, sum_k (x[i, k] - m[i])^2: m[i] steps by one along i, the last
    # output axis, as B[k, j] does in a matmul; but it does not run along k: a row reduction
    X = te.placeholder((32, 5400), "float32", name="X")
    M = te.placeholder((32,), "float32", name="M")
    k = te.reduce_axis((0, 5400), "k")
    var = te.create_prim_func([X, M, te.compute((32,), lambda i: te.sum(
        (X[i, k] - M[i]) * (X[i, k] - M[i]), axis=k), name="V")])
    assert block_infos(tvm.s_tir.Schedule(var))[0].kind == "row_reduce"
    result = schedule_kernel(var, MACHINE)
    assert result.choices[0][0].startswith("row_per_core")
    rng = np.random.default_rng(0)
    x, m = rng.standard_normal((32, 5400)).astype("float32"), rng.standard_normal(32).astype("float32")
    (got,) = _run(result.func, [x, m], [(32,)])
    np.testing.assert_allclose(got, ((x - m[:, None]) ** 2).sum(-1), rtol=1e-4)
    # a column sum, sum_k x[k, j], still reads along both: it stays an anchor
    C = te.placeholder((64, 32), "float32", name="C")
    kc = te.reduce_axis((0, 64), "kc")
    col = te.create_prim_func([C, te.compute((32,), lambda j: te.sum(C[kc, j], axis=kc), name="S")])
    assert block_infos(tvm.s_tir.Schedule(col))[0].kind == "anchor"


def test_a_short_row_axis_is_the_whole_register_tile():
    # (128, 4, 256) x (256, 96): the rows' axis is 4 long; a tile of 2 rows left 4 accumulators
    A = te.placeholder((128, 4, 256), "float32", name="A")
    B = te.placeholder((256, 96), "float32", name="B")
    k = te.reduce_axis((0, 256), name="k")
    func = te.create_prim_func([A, B, te.compute((128, 4, 96), lambda b, i, j: te.sum(A[b, i, k] * B[k, j], axis=k),
                                                 name="C")])
    (choice,) = schedule_kernel(func, MACHINE).choices
    assert choice[1]["tile_i"] == 4
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((128, 4, 256)).astype("float32"), rng.standard_normal((256, 96)).astype("float32")
    (got,) = _run(schedule_kernel(func, MACHINE).func, [a, b], [(128, 4, 96)])
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("mcpu, n, tile, k_unroll", [("skylake-avx512", 1024, (8, 32), 1), ("znver3", 1024, (4, 16), 4),
                                                     ("znver3", 768, (6, 16), 4), ("x86-64", 768, (6, 8), 4)])
def test_the_register_tile_fits_the_machines_vector_registers(mcpu, n, tile, k_unroll):
    # accumulators (rows x vectors of B's row), B's row and a broadcast stay in registers:
    # AVX-512's 32 hold 8 rows of 2 vectors; AVX2's and SSE's 16 hold (6 + 1) x 2 + 1 = 15, so
    # 6 rows where they divide the axis (768), else 4 (1024). 8 rows there spilled (110 GFLOP/s
    # against 187 for 4 at 1024^3, AVX2 code on a Zen 4). A k step of AVX-512's tile is 16 FMAs,
    # one step a loop iteration; the smaller tiles' 8 or 12 are unrolled 4 steps an iteration
    machine = Machine.for_target(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    A = te.placeholder((n, 256), "float32", name="A")
    B = te.placeholder((256, n), "float32", name="B")
    k = te.reduce_axis((0, 256), name="k")
    func = te.create_prim_func([A, B, te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")])
    (choice,) = schedule_kernel(func, machine).choices
    assert (choice[1]["tile_i"], choice[1]["tile_j"], choice[1]["k_unroll"]) == (*tile, k_unroll)
    vectors = tile[1] // (machine.vector_bytes // 4)
    assert (tile[0] + 1) * vectors + 1 <= machine.vector_registers


@pytest.mark.parametrize("mcpu, units, latency, sums", [("znver4", 1, 4, 64), ("skylake-avx512", 2, 4, 128),
                                                        ("znver3", 2, 4, 64), ("haswell", 2, 5, 80), ("x86-64", 2, 4, 32)])
def test_the_machine_knows_its_fma_units_and_the_sums_a_register_tile_needs(mcpu, units, latency, sums):
    # units x latency x lanes: Zen 4 one 512-bit FMA a cycle (two 256-bit halves) of 4 cycles,
    # 16 lanes: 64; an AVX-512 Xeon two: 128; Zen 3 two of 8 lanes: 64; Haswell's take 5 cycles
    machine = Machine.for_target(cpu_target(mcpu))
    assert (machine.fma_units, machine.fma_latency) == (units, latency)
    assert machine.tile_accumulators() == sums and machine.tile_accumulators(64) == sums // 2


def _tile_sums(settings):
    return [RegisterTiledAnchor.tile_sums(k) for k in settings]


@pytest.mark.parametrize("mcpu, floor", [("znver4", 64), ("skylake-avx512", 128), ("znver3", 64), ("x86-64", 32),
                                         ("haswell", 64)])
def test_the_register_tile_space_leaves_out_tiles_too_small_for_the_fma_units(mcpu, floor):
    """A tile with fewer sums than the FMA units keep in flight leaves them waiting: on a Zen 4
    such tiles were half of a GEMM's space, the fastest of them 1.55-1.78x as slow as the best.
    Haswell's units want 80 sums, but at 512 the largest AVX2 tile that fits 16 registers is 4 x
    16 (6 rows do not divide 512; 8 x 16 takes 19): tiles of 64 stay. The heuristic's tile stays;
    where no tile is that large (one row), the largest ones stay."""
    machine = Machine.for_target(cpu_target(mcpu))
    policy = RegisterTiledAnchor(machine)
    assert machine.tile_accumulators() == (80 if mcpu == "haswell" else floor)
    info = block_infos(ScheduleBuilder(_matmul(512, 512, 512)).sch)[0]
    every, kept = list(Policy.candidates(policy, info)), list(policy.candidates(info))
    assert min(_tile_sums(kept)) == floor
    assert kept == [k for k, n in zip(every, _tile_sums(every)) if n >= floor] and len(kept) < len(every)
    assert policy.default(info) in kept
    short = block_infos(ScheduleBuilder(_matmul(1, 64, 64)).sch)[0]
    every, kept = list(Policy.candidates(policy, short)), list(policy.candidates(short))
    largest = max(_tile_sums(every))
    assert largest < floor and kept and set(_tile_sums(kept)) == {largest}


def _layer_norm_then(act, rows, n):
    """The one unscheduled kernel of a LayerNorm over rows of ``n``, then ``act``."""
    ones, zeros = relax.const(np.ones(n, "float32")), relax.const(np.zeros(n, "float32"))
    return _row_kernel(lambda x: act(R.nn.layer_norm(x, ones, zeros, axes=[-1])), rows, n)


@pytest.mark.parametrize("vector_bytes,wide,narrow", [(64, 30, 4), (32, 15, 4)])
def test_a_row_no_vector_divides_takes_a_wide_vector_where_its_arithmetic_bounds_it(vector_bytes, wide, narrow):
    """A LayerNorm over rows of 900 (no multiple of 16 or 8 lanes): with a GELU after it, the
    output pass (80 operations an element) takes row_vector's 30 lanes (15 with AVX2), not
    vector_factor's 4 (Zen 4, 256 rows: 0.32 -> 0.145 ms; built for znver3, 0.67x); the LayerNorm
    alone (8 operations, bound by memory) keeps 4 (30 lanes were 2-5% slower, 15 17-20%)."""
    machine = Machine(cores=2, vector_bytes=vector_bytes)
    gelu = schedule_kernel(_layer_norm_then(R.nn.gelu, 16, 900), machine)
    plain = schedule_kernel(_layer_norm_then(lambda y: y, 16, 900), machine)
    assert [c.partition("@")[0] for c, _ in gelu.choices] == ["persistent_rows"]
    assert f"T.vectorized({wide})" in gelu.script()
    assert f"T.vectorized({wide})" not in plain.script() and f"T.vectorized({narrow})" in plain.script()
    x = np.random.default_rng(0).standard_normal((16, 900)).astype("float32")
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    gamma_beta = [np.ones(900, "float32"), np.zeros(900, "float32")]  # the LayerNorm's constants
    (got,) = _run(gelu.func, [x, *gamma_beta], [(16, 900)])
    np.testing.assert_allclose(got, 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2))), rtol=1e-4, atol=1e-5)
    (got,) = _run(plain.func, [x, *gamma_beta], [(16, 900)])
    np.testing.assert_allclose(got, y, rtol=1e-4, atol=1e-5)


def test_a_tvm_kernel_that_calls_what_has_no_vector_form_keeps_tvms_loops():
    # sinh has no lowering of ours and TVM's kernel of it calls tirx.sinh, which LLVM cannot
    # vectorize (scheduled, the build failed): it stays as TVM made it, the reason recorded
    from tvm_ext.pipeline import Pipeline
    mod = build_module(lambda x: relax.op.sinh(x), [((64, 32), "float32")])
    pipeline = Pipeline(fusion="none")
    compiled = pipeline.run(mod)
    (kernel,) = compiled.report().kernels
    assert kernel.source == "tvm" and not kernel.schedule
    assert "tirx.sinh" in dict(pipeline.scheduler.fallbacks)[kernel.name]
    x = np.random.default_rng(0).standard_normal((64, 32)).astype("float32")
    np.testing.assert_allclose(compiled(x), np.sinh(x), rtol=1e-5)


@pytest.mark.parametrize("mcpu", ["host", "skylake-avx512", "znver3", "x86-64"])
@pytest.mark.parametrize("blocks, h, w", [(2, 8, 16), (3, 5, 12)])
def test_a_blocked_convolutions_nchw_epilogue_runs_on_its_register_tile(blocks, h, w, mcpu):
    """With the epilogue knob on, the epilogue that writes NCHW moves onto the register tile
    and reads the tile itself: a loop nest fewer at the root, and the blocked result is never
    written whole. Off, the tile is written back and the epilogue runs after, at the root.
    Scheduled for each target; on the host both run and match the unscheduled kernel."""
    target = tvm_ext.host_target() if mcpu == "host" else tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    machine = Machine.for_target(target)
    func = _conv_back_to_nchw(blocks, h, w)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in func.params[:-1]]
    out_shape = [int(d) for d in func.params[-1].shape]
    want = _run(func, inputs, [out_shape])[0] if mcpu == "host" else None
    nests = {}
    for fused in (True, False):
        result = schedule_kernel(func, machine, fuse_epilogue=fused)
        roles = {g.block: g.role for g in result.groups}
        nests[fused] = [s for s in _root_statements(result.func) if isinstance(s, tvm.tirx.For)]
        if fused:
            assert roles["O"] == "epilogue on the tile, in its own layout" and "Y_global" not in roles, roles
            assert "Y_global[" in str(nests[fused][-1]) and "O[" in str(nests[fused][-1])
        else:
            assert roles["Y_global"] == "write-back of the tile" and roles["O"] != roles["Y_global"], roles
        if mcpu == "host":
            (got,) = _run(result.func, inputs, [out_shape])
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)
    assert len(nests[True]) == len(nests[False]) - 1


def _root_statements(func) -> list:
    body = func.body
    while not isinstance(body, (tvm.tirx.For, tvm.tirx.SeqStmt)):
        body = body.block.body if hasattr(body, "block") else body.body
    return list(body.seq) if isinstance(body, tvm.tirx.SeqStmt) else [body]
