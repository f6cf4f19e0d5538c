"""NNVM's fusion partition on the seed's examples, worked out by hand, and compiled."""
from __future__ import annotations

import numpy as np
from tvm import relax

import tvm_ext
from conftest import build_module, compile_strict
from relay_passes import DataflowGraph, FusePartition
from relay_passes import fuse_partition as fp
from tvm_ext import OpPattern

R = relax.op


def _plan(mod, **kw):
    graph = DataflowGraph(mod["main"].body.blocks[0])
    return graph, FusePartition(**kw).analyze(graph)


def _groups(graph, plan):
    return [[graph[n].name for n in g.nodes] for g in plan.partition().groups]


def _names(graph, idx):
    return graph[idx].name


def _conv(x, w):
    return R.nn.conv2d(x, w, padding=1)


CONV_SPECS = [((1, 4, 6, 6), "float32"), ((4, 4, 3, 3), "float32")]


def _conv_ref(x, w):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((1, 4, 6, 6), "float32")
    for a in range(3):
        for b in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, a:a + 6, b:b + 6], w[:, :, a, b])
    return out


def _rand(*shapes):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype("float32") for s in shapes]


# --------------------------------------------------------------------------- diamond
#        c = conv2d(x, w)          OutEWiseFusable, 3 readers: realized in the forward pass
#      /        |        \
#  b1=relu  b2=sigmoid  b3=neg    ElemWise: each fuses into the add that reads it
#      \        |        /
#   a1 = add(b1, b2); a2 = add(a1, b3)   one group rooted at a2
# Diamond step: all of c's readers are in a2's group (all ElemWise) -> c joins: ONE group,
# master c, pattern OutEWiseFusable.
def _diamond(x, w):
    bb = relax.BlockBuilder.current()
    c = bb.emit(_conv(x, w))
    b1, b2, b3 = bb.emit(R.nn.relu(c)), bb.emit(R.sigmoid(c)), bb.emit(R.negative(c))
    a1 = bb.emit(R.add(b1, b2))
    return R.add(a1, b3)


def test_diamond_conv_with_three_branches_is_one_group():
    graph, plan = _plan(build_module(_diamond, CONV_SPECS))
    names = [n.name for n in graph]
    c, a2 = names.index("lv"), len(names) - 1
    forward = [d.reason for d in plan.log if d.node == c]
    assert forward[0] == f"{fp.REALIZE_READERS}: 3 readers"  # the forward pass realizes it ...
    assert forward[1].startswith(fp.FUSED_DIAMOND)  # ... the diamond step fuses it
    assert plan.fuse_rule[c] is fp.FuseRule.FUSE_TO_MASTER
    assert _groups(graph, plan) == [names]
    assert {plan.master_node[i] for i in range(len(names))} == {c}
    assert {plan.group_root[i] for i in range(len(names))} == {a2}
    assert plan.fuse_pattern[a2] == OpPattern.OUT_EWISE_FUSABLE
    assert any(d.reason.startswith(fp.FUSED_DIAMOND) and d.node == c for d in plan.log)


def test_diamond_is_off_when_disabled():
    graph, plan = _plan(build_module(_diamond, CONV_SPECS), diamond=False)
    assert _groups(graph, plan) == [["lv"], ["lv1", "lv2", "lv3", "lv4", "gv"]]


def test_diamond_compiles_to_one_kernel_matching_numpy():
    x, w = _rand((1, 4, 6, 6), (4, 4, 3, 3))
    compiled = compile_strict(build_module(_diamond, CONV_SPECS), fusion="nnvm")
    (kernel,) = compiled.report().kernels
    assert kernel.ops == ["nn.conv2d", "nn.relu", "sigmoid", "negative", "add", "add"]
    assert "epilogue on the tile" in kernel.schedule  # the branches run on the conv's output tiles
    c = _conv_ref(x, w)
    np.testing.assert_allclose(compiled(x, w), np.maximum(c, 0) + 1 / (1 + np.exp(-c)) - c, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- re-pointing
#   c = conv2d(x, w)        OutEWiseFusable
#   t = permute_dims(y)     Injective
#   s = sigmoid(z)          ElemWise
#   a = add(c, t)           fuses an OutEWiseFusable AND an Injective input -> master := a
#   o = add(a, s)           root
def _repoint(x, w, y, z):
    bb = relax.BlockBuilder.current()
    c = bb.emit(_conv(x, w))
    t = bb.emit(R.permute_dims(y, [0, 1, 3, 2]))
    s = bb.emit(R.sigmoid(z))
    a = bb.emit(R.add(c, t))
    return R.add(a, s)


REPOINT_SPECS = CONV_SPECS + [((1, 4, 6, 6), "float32")] * 2


def test_master_is_repointed_when_an_anchor_and_an_injective_input_meet():
    graph, plan = _plan(build_module(_repoint, REPOINT_SPECS))
    idx = {n.name: n.index for n in graph}
    a = idx["lv3"]
    assert _groups(graph, plan) == [["lv", "lv1", "lv2", "lv3", "gv"]]
    assert all(plan.master_node[i] == a for i in idx.values())
    assert plan.group_root[idx["lv"]] == idx["gv"]
    assert [d.node for d in plan.log if d.reason.startswith(fp.MASTER_REPOINTED)] == [a]


def test_repointed_group_compiles_and_keeps_its_stages_apart():
    x, w, y, z = _rand((1, 4, 6, 6), (4, 4, 3, 3), (1, 4, 6, 6), (1, 4, 6, 6))
    compiled = compile_strict(build_module(_repoint, REPOINT_SPECS), fusion="nnvm")
    (kernel,) = compiled.report().kernels
    assert kernel.pattern == "OutEWiseFusable" and "epilogue on the tile" not in kernel.schedule
    want = _conv_ref(x, w) + y.transpose(0, 1, 3, 2) + 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(compiled(x, w, y, z), want, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- small cases
def test_transpose_between_elementwise_ops_is_one_injective_group():
    mod = build_module(lambda x: R.nn.relu(R.permute_dims(R.exp(x), [1, 0])), [((3, 5), "float32")])
    graph, plan = _plan(mod)
    assert _groups(graph, plan) == [["lv", "lv1", "gv"]]
    assert plan.partition().groups[0].pattern == OpPattern.INJECTIVE
    (x,) = _rand((3, 5))
    np.testing.assert_allclose(compile_strict(mod, "nnvm")(x), np.maximum(np.exp(x).T, 0), rtol=1e-6)


def test_two_reductions_in_a_row_are_two_groups():
    mod = build_module(lambda x: R.sum(R.sum(x, axis=[1]), axis=[0]), [((4, 6), "float32")])
    graph, plan = _plan(mod)
    assert _groups(graph, plan) == [["lv"], ["gv"]]
    (reason,) = [d.reason for d in plan.log if d.node == 0]
    assert reason.startswith(fp.REALIZE_PATTERN)
    (x,) = _rand((4, 6))
    np.testing.assert_allclose(compile_strict(mod, "nnvm")(x), x.sum(), rtol=1e-5)


def test_an_opaque_op_in_the_middle_of_a_chain_splits_it():
    mod = build_module(lambda x: R.nn.relu(R.cumsum(R.exp(x), axis=1)), [((3, 4), "float32")])
    graph, plan = _plan(mod)
    assert _groups(graph, plan) == [["lv"], ["gv"]]  # cumsum keeps TVM's kernel
    reasons = {graph[d.node].name: d.reason for d in plan.log}
    assert reasons["lv"].startswith(fp.REALIZE_NO_LOWERING)
    assert str(graph[1].pattern) == "Opaque"  # TVM gives cumsum no kernel pattern either
    (x,) = _rand((3, 4))
    np.testing.assert_allclose(compile_strict(mod, "nnvm")(x), np.maximum(np.cumsum(np.exp(x), 1), 0), rtol=1e-5)


def test_anchor_takes_an_epilogue_of_the_same_shape_only():
    # matmul -> add(bias) -> relu fuse; a broadcast add that grows the shape does not
    def make(a, b, c):
        bb = relax.BlockBuilder.current()
        m = bb.emit(R.matmul(a, b))
        r = bb.emit(R.nn.relu(R.add(m, c)))
        return R.add(R.expand_dims(r, [0]), relax.const(np.zeros((3, 1, 1), "float32")))
    graph, plan = _plan(build_module(make, [((4, 8), "float32"), ((8, 5), "float32"), ((5,), "float32")]))
    groups = _groups(graph, plan)
    assert groups[0] == ["lv", "lv1", "lv2"]
    assert plan.master_node[0] == 0


def test_user_override_realizes_a_node():
    mod = build_module(lambda x: R.nn.relu(R.exp(x)), [((4,), "float32")])
    graph, plan = _plan(mod, realize={"lv"})
    assert _groups(graph, plan) == [["lv"], ["gv"]]
    assert any(d.reason.startswith(fp.REALIZE_OVERRIDE) for d in plan.log)
    compiled = tvm_ext.compile(mod, fusion=FusePartition(realize={"lv"}))
    assert compiled.report().num_kernels == 2


def test_plan_prints_master_root_and_pattern_per_node():
    graph, plan = _plan(build_module(_diamond, CONV_SPECS))
    text = plan.describe()
    assert text.splitlines()[0].split() == ["node", "op", "own", "pattern", "group", "pattern", "rule",
                                            "master", "root"]
    assert "nn.conv2d" in text and "OutEWiseFusable" in text
    assert fp.FUSED_DIAMOND in plan.log_text()


def test_decisions_reach_the_compiled_report():
    compiled = tvm_ext.compile(build_module(_diamond, CONV_SPECS), fusion="nnvm")
    report = compiled.report()
    assert any(d.reason.startswith(fp.FUSED_DIAMOND) for d in report.decisions)
    assert "fused:diamond" in report.decisions_text()
