"""The Loop IR and the shared lowering helpers, on hand-checked examples."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from tvm_ext import loop_ir as L
from tvm_ext.errors import ShapeError
from tvm_ext.lowering import (KernelBuilder, broadcast_shapes, concat, permute, pointwise, reduce, reshape,
                              strided_slice)


@pytest.mark.parametrize("dtypes,want", [
    (("float32", "float32"), "float32"), (("float16", "float32"), "float32"), (("int32", "float16"), "float16"),
    (("int8", "int32"), "int32"), (("uint8", "int8"), "int16"), (("bool", "int64"), "int64"),
    (("bool", "bool"), "bool"), (("float64", "int64"), "float64")])
def test_promotion_follows_torch(dtypes, want):
    import torch
    assert L.promote_dtypes(*dtypes) == want
    assert torch.promote_types(*(getattr(torch, d) for d in dtypes)) == getattr(torch, want)


def test_half_is_computed_in_float32():
    assert L.compute_dtype("float16") == "float32"
    assert L.compute_dtype("int8") == "int8"


def test_broadcast_shapes():
    assert broadcast_shapes((3, 1, 5), (4, 5)) == (3, 4, 5)
    assert broadcast_shapes((), (2,)) == (2,)
    with pytest.raises(ShapeError, match="node7.*dimension 1"):
        broadcast_shapes((3, 4), (3, 5), node="node7")


def _kernel_text(build):
    kb = KernelBuilder("k")
    out = build(kb)
    kb.store(out, "out")
    return kb


def test_pointwise_composes_and_broadcasts_by_index():
    def build(kb):
        x = kb.add_input("x", (4, 8), "float32")
        b = kb.add_input("b", (8,), "float32")
        return pointwise(lambda u, v: L.exp(u + v), [x, b], "float32", "f")
    kb = _kernel_text(build)
    text = kb.describe()
    assert "store out[i0, i1] = exp(add(load(x, [i0, i1]), load(b, [i1])))" in text
    assert len(kb.stages) == 1  # one stage: the pointwise op was inlined, not realized


def test_cast_inserted_by_promotion():
    def build(kb):
        x = kb.add_input("x", (4,), "int32")
        y = kb.add_input("y", (4,), "float32")
        return pointwise(L.add, [x, y], "float32", "f")
    assert "add(cast<float32>(load(x, [i0])), load(y, [i0]))" in _kernel_text(build).describe()


def test_reduction_is_realized_as_a_local_stage():
    def build(kb):
        x = kb.add_input("x", (4, 16), "float32")
        s = reduce(kb, x, [1], "sum", True, "float32", "s")
        return pointwise(lambda a, t: a / t, [x, s], "float32", "n")
    kb = _kernel_text(build)
    kinds = [(st.name, st.is_output) for st in kb.stages]
    assert kinds == [("s", False), ("out", True)]
    assert "reduce_sum[k0<16](load(x, [i0, k0]))" in kb.describe()
    assert "divide(load(x, [i0, i1]), load(s, [i0, 0]))" in kb.describe()


def test_views_are_index_maps_only():
    def build(kb):
        x = kb.add_input("x", (2, 3, 4), "float32")
        t = permute(x, [2, 0, 1])                  # (4, 2, 3)
        r = reshape(t, (4, 6))                     # merges the last two dims
        return strided_slice(r, [1], [1], [6], [2])  # (4, 3)
    kb = _kernel_text(build)
    assert len(kb.stages) == 1 and kb.stages[0].buffer.shape == (4, 3)
    assert L.count_loads(kb.stages[0].expr) == 1
    assert not any(isinstance(n, L.Compute) for n in L.walk(kb.stages[0].expr))


def test_a_reshape_read_is_indexed_as_the_loops_ranges_allow():
    """mean over (4, 48, 30, 30) seen as (4, 8, 5400): the reshape's map is row-major div/mod,
    ``((i1 * 5400 + k) // 43200 + i0) % 4`` on the batch axis without the loops' ranges. With
    i1 < 8 and k < 5400, i1 * 5400 + k < 43200: the batch index is i0; the channel index
    (i1 * 6 + k // 900) % 48 < 48 needs no modulo either."""
    def build(kb):
        x = kb.add_input("x", (4, 48, 30, 30), "float32")
        return reduce(kb, reshape(x, (4, 8, 5400)), [2], "sum", False, "float32", "s")
    kb = KernelBuilder("k")
    func = kb.build([kb.store(build(kb), "y")])
    reads = str(func)
    assert "x[v_i0, v_i1 * 6 + v_k0 // 900, v_k0 % 900 // 30, v_k0 % 30]" in reads
    assert "% 4" not in reads and "% 48" not in reads
    lib = tvm.compile(func, "llvm")
    xv = np.random.default_rng(0).standard_normal((4, 48, 30, 30)).astype("float32")
    y = tvm.runtime.empty((4, 8), "float32")
    lib["k"](tvm.runtime.tensor(xv), y)
    np.testing.assert_allclose(y.numpy(), xv.reshape(4, 8, -1).sum(-1), rtol=1e-5, atol=1e-3)


def test_concat_is_a_guarded_select():
    def build(kb):
        a = kb.add_input("a", (2, 3), "float32")
        b = kb.add_input("b", (2, 5), "float32")
        return concat([a, b], 1)
    expr = _kernel_text(build).stages[0].expr
    assert isinstance(expr, L.Select) and expr.guarded
    assert L.count_loads(expr) == 2


def test_compute_rejects_mixed_dtypes():
    buf = L.Buffer("x", (2,), "float32")
    ibuf = L.Buffer("i", (2,), "int32")
    with pytest.raises(TypeError, match="disagree on dtype"):
        L.compute("add", L.Load(buf, (0,)), L.Load(ibuf, (0,)))


def test_walk_counts_shared_nodes_once():
    buf = L.Buffer("x", (2,), "float32")
    x = L.Load(buf, (0,))
    e = L.exp(x)
    y = e * e + e
    assert L.count_nodes(y) == 4  # add, multiply, exp, load
    assert L.count_loads(y) == 1


def test_to_te_builds_a_runnable_kernel():
    kb = KernelBuilder("k")
    x = kb.add_input("x", (3, 5), "float32")
    out = pointwise(lambda v: L.select(L.greater(v, 0.0), v, v * 0.5), [x], "float32", "leaky")
    stage = kb.store(out, "y")
    func = kb.build([stage])
    lib = tvm.compile(func, "llvm")
    xv = np.random.default_rng(0).standard_normal((3, 5)).astype("float32")
    y = tvm.runtime.empty((3, 5), "float32")
    lib["k"](tvm.runtime.tensor(xv), y)
    np.testing.assert_allclose(y.numpy(), np.where(xv > 0, xv, xv * 0.5), rtol=0, atol=0)


def test_reinterpret_reads_a_floats_bits_as_an_integer_of_its_width():
    kb = KernelBuilder("k")
    x = kb.add_input("x", (4,), "float32")
    out = pointwise(lambda v: L.reinterpret(v, "int32"), [x], "int32", "bits")
    assert L.format_expr(out.load((0,))) == "reinterpret<int32>(load(x, [0]))"
    lib = tvm.compile(kb.build([kb.store(out, "y")]), "llvm")
    xv = np.array([1.0, -2.0, -0.0, np.inf], "float32")
    y = tvm.runtime.empty((4,), "int32")
    lib["k"](tvm.runtime.tensor(xv), y)
    np.testing.assert_array_equal(y.numpy(), xv.view("int32"))
    with pytest.raises(TypeError, match="width"):
        L.reinterpret(x.load((0,)), "int64")


def test_reduce_translates_to_te_sum():
    axis = te.reduce_axis((0, 4), name="k")
    buf = L.Buffer("x", (4,), "float32")
    buf.tensor = te.placeholder((4,), "float32", name="x")
    expr = L.to_te(L.Reduce("sum", L.Load(buf, (axis.var,)), (axis,)))
    assert "reduce" in type(expr).__name__.lower()


def test_nested_vectorizable_forms_bind_their_arguments_once():
    # exp(log(exp(log(x) - 1) - 1) - 1): each fast form uses its argument a dozen times; copied
    # instead of bound, the TIR would hold ~30^4 copies of the load (a 480k-character line
    # and minutes of build time in a fused backward kernel).
    buf = L.Buffer("x", (4,), "float32")
    buf.tensor = te.placeholder((4,), "float32", name="x")
    e = L.Load(buf, (0,))
    for _ in range(2):
        e = L.exp(L.log(e) - 1.0)
    fast, exact = str(L.to_te(e)), str(L.to_te(e, exact_math=True))
    assert "T.exp" not in fast and "T.exp" in exact
    assert fast.count("tensor_load") == 1  # read once, bound by a Let (40k characters without)
    assert len(fast) < 6000


def test_inlined_size_counts_every_use_of_a_shared_node():
    # worked by hand: a load is 1 node, (x + x) is 3, (x + x) * (x + x) is 1 + 3 + 3 = 7 as a
    # tree, though the DAG has 3 nodes; plain arithmetic translates one node per Loop IR node
    buf = L.Buffer("x", (2,), "float32")
    x = L.Load(buf, (0,))
    s = x + x
    assert L.count_nodes(s * s) == 3
    assert L.inlined_size(s * s) == 7


def test_nested_maxima_grow_linearly():
    # maximum(x, y) propagates NaN. As select(isnan(a), a, select(a > b, a, b)) it read a four
    # times: five nested held 4^5 copies of x inside selects on its bits, and TVM took 66 s to
    # compile that kernel; six, clamped between, over 200 s. LLVM's maximum reads each once.
    x, y = (L.Buffer(n, (4,), "float32") for n in "xy")
    for b in (x, y):
        b.tensor = te.placeholder((4,), "float32", name=b.name)
    e, sizes = L.Load(x, (0,)), []
    for _ in range(6):
        e = L.minimum(L.maximum(L.maximum(e * 1.1, L.Load(y, (0,))), -8.0), 8.0)
        sizes.append(L.inlined_size(e))
        assert sizes[-1] == L.tir_inlined_size(L.to_te(e))
    # worked by hand: a level adds multiply(e, 1.1) (2 nodes: *, 1.1), three calls of an
    # intrinsic (the call and its id: 2 each), y's load (1) and the numbers -8 and 8: 11
    assert [b - a for a, b in zip(sizes, sizes[1:])] == [11] * 5, sizes
    assert str(L.to_te(e)).count("llvm.maximum") == 12


def test_inlined_size_profiles_an_op_on_its_numbers():
    # power(x, 0.5) given as a number is sqrt(x): the call and x, 2 nodes; power(x, y) guards a
    # negative base with a fractional exponent and reads each operand three times
    x, y = (L.Buffer(n, (4,), "float32") for n in "xy")
    for b in (x, y):
        b.tensor = te.placeholder((4,), "float32", name=b.name)
    root = L.power(L.Load(x, (0,)), 0.5)
    general = L.power(L.Load(x, (0,)), L.Load(y, (0,)))
    assert L.inlined_size(root) == L.tir_inlined_size(L.to_te(root)) == 2
    assert L.inlined_size(general) == L.tir_inlined_size(L.to_te(general)) > 2 + 3 + 3


@pytest.mark.parametrize("form", ["exp", "log", "tanh", "erf", "sigmoid"])
def test_inlined_size_matches_the_translated_tir(form):
    # Loop IR's estimate (per-op profiles) equals a direct count of the TIR to_te makes, Lets
    # substituted, for a form of a form: the size that TVM's analyzer walks
    buf = L.Buffer("x", (4,), "float32")
    buf.tensor = te.placeholder((4,), "float32", name="x")
    x = L.Load(buf, (0,))
    inner = getattr(L, form)(x * 2.0 + 1.0)
    expr = L.tanh(L.select(L.greater(x, 20.0), x, inner)) * x
    for exact in (False, True):
        assert L.inlined_size(expr, exact) == L.tir_inlined_size(L.to_te(expr, exact))
    # nesting multiplies: tanh reads its argument hundreds of times once its Lets are substituted
    assert L.inlined_size(expr) > 100 * L.inlined_size(inner)
    assert L.inlined_size(expr, exact_math=True) < 20
