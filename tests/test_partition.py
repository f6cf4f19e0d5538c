"""Trivial partitions and group construction on small graphs worked out by hand."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from conftest import build_module, compile_strict
from relay_passes import DataflowGraph, MakeGroups, partition_chains, partition_none
from relay_passes.partition import partition_each
from tvm_ext import OpPattern

R = relax.op

#   a = add(x, b)      Broadcast      \ chain: a's only reader is e
#   e = exp(a)         ElemWise       /
#   m = matmul(e, w)   OutEWiseFusable   alone (not ElemWise/Broadcast)
#   r = relu(m)        ElemWise          alone: its producer is an anchor, it has 2 readers
#   s = sum(r, 1)      CommReduce        alone
#   t = multiply(r, 2) ElemWise       \ chain
#   u = add(t, c)      Broadcast      /
SPECS = [((8, 16), "float32"), ((16,), "float32"), ((16, 32), "float32"), ((32,), "float32")]


def _graph_module():
    def make(x, b, w, c):
        bb = relax.BlockBuilder.current()
        a = bb.emit(R.add(x, b))
        e = bb.emit(R.exp(a))
        m = bb.emit(R.matmul(e, w))
        r = bb.emit(R.nn.relu(m))
        s = bb.emit(R.sum(r, axis=[1]))
        t = bb.emit(R.multiply(r, relax.const(2.0, "float32")))
        u = bb.emit(R.add(t, c))
        return relax.Tuple([s, u])
    return build_module(make, SPECS, ["x", "b", "w", "c"])


def _block(mod):
    return mod["main"].body.blocks[0]


def _names(graph, part):
    return [[graph[n].op.replace("relax.", "") for n in g.nodes] for g in part.groups]


def test_chains_partition_by_hand():
    graph = DataflowGraph(_block(_graph_module()))
    part = partition_chains(graph)
    assert _names(graph, part) == [["add", "exp"], ["matmul"], ["nn.relu"], ["sum"], ["multiply", "add"]]
    assert [g.pattern for g in part.groups] == [OpPattern.BROADCAST, OpPattern.OUT_EWISE_FUSABLE,
                                                 OpPattern.ELEMWISE, OpPattern.COMM_REDUCE, OpPattern.BROADCAST]
    reasons = {graph[d.node].op: d.reason for d in part.decisions}
    assert reasons["relax.nn.relu"] == "realized: 2 readers"
    assert reasons["relax.exp"] == "group root"


def test_none_partition_is_one_group_per_op():
    graph = DataflowGraph(_block(_graph_module()))
    part = partition_none(graph)
    assert [len(g.nodes) for g in part.groups] == [1] * 7


def test_diamond_of_elementwise_ops_fuses_into_one_tree():
    def make(x):
        bb = relax.BlockBuilder.current()
        a = bb.emit(R.exp(x))
        b = bb.emit(R.negative(x))
        return R.add(a, b)
    graph = DataflowGraph(_block(build_module(make, [((4, 4), "float32")])))
    assert _names(graph, partition_chains(graph)) == [["exp", "negative", "add"]]


def test_views_alone_stay_tvm_reshapes_and_each_gives_them_kernels():
    def make(x):
        bb = relax.BlockBuilder.current()
        r = bb.emit(R.reshape(x, (16,)))
        return R.exp(r)
    graph = DataflowGraph(_block(build_module(make, [((4, 4), "float32")])))
    part = partition_chains(graph)
    assert _names(graph, part) == [["exp"]]
    assert [(graph[d.node].op, d.action) for d in part.decisions if d.action == "view"] == [("relax.reshape", "view")]
    assert _names(graph, partition_each(graph)) == [["reshape"], ["exp"]]


def test_unlowerable_nodes_stay_outside_groups():
    def make(x):
        bb = relax.BlockBuilder.current()
        a = bb.emit(R.exp(x))
        c = bb.emit(R.cumsum(a, axis=1))  # no lowering of ours: TVM's kernel
        return R.nn.relu(c)
    graph = DataflowGraph(_block(build_module(make, [((4, 4), "float32")])))
    part = partition_chains(graph)
    assert _names(graph, part) == [["exp"], ["nn.relu"]]
    tvm_nodes = [(graph[d.node].op, d.reason) for d in part.decisions if d.action == "tvm"]
    assert tvm_nodes == [("relax.cumsum", "no lowering registered")]


def test_make_groups_outlines_primitive_functions():
    mg = MakeGroups("chains")
    mod = mg(_graph_module())
    groups = {gv.name_hint: f for gv, f in mod.functions_items()
              if isinstance(f, relax.Function) and f.attrs is not None and "Primitive" in f.attrs}
    assert sorted(groups) == ["fused_add_exp", "fused_matmul", "fused_multiply_add", "fused_relu", "fused_sum"]
    f = groups["fused_add_exp"]
    assert [p.name for p in f.params] == ["x", "b"]
    assert str(f.attrs["tvm_ext.pattern"]) == "Broadcast"
    calls = [b.value.op.name_hint for b in mod["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.GlobalVar)]
    assert calls == ["fused_add_exp", "fused_matmul", "fused_relu", "fused_sum", "fused_multiply_add"]
    assert "Primitive" in mod.script()
    assert len(mg.partitions) == 1


def test_chain_fused_model_matches_numpy():
    rng = np.random.default_rng(0)
    x, b, w, c = (rng.standard_normal(s).astype("float32") * 0.5 for s, _ in SPECS)
    compiled = compile_strict(_graph_module(), fusion="chains")
    assert compiled.report().num_kernels == 5
    s, u = compiled(x, b, w, c)
    r = np.maximum(np.exp(x + b) @ w, 0)
    np.testing.assert_allclose(s, r.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(u, r * 2 + c, rtol=1e-6, atol=1e-6)


def test_chains_look_through_the_fields_of_a_multi_output_op():
    def make(x, g):
        bb = relax.BlockBuilder.current()
        bn = bb.emit(R.nn.batch_norm(x, g, g, g, g, axis=1, training=False))
        y = bb.emit(relax.TupleGetItem(bn, 0))
        return R.nn.relu(y)
    graph = DataflowGraph(_block(build_module(make, [((2, 3, 4, 4), "float32"), ((3,), "float32")])))
    part = partition_chains(graph)
    assert [[graph[n].op or graph[n].kind for n in g.nodes] for g in part.groups] == \
        [["relax.nn.batch_norm", "get_item", "relax.nn.relu"]]
