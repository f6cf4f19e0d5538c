"""AutoFuse graph lowering: the seed's walk-through, recompute and its blow-up guard, every
stop rule, rollback, multi-stage kernels, ConcretizeBroadcast, and the strategy choice."""
from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_ext
from tvm_ext import sym
from conftest import build_module, compile_strict
from relay_passes import DataflowGraph
from relay_passes.autofuse import STOP_RULES, AutoFuse, BoxKind
from relay_passes.concretize_broadcast import concretize_broadcast, is_broadcast_view
from relay_passes.strategies import partition_nnvm
from relay_passes.fuse_partition import FusePartition
from tvm_ext.machine import Machine
from tvm_ext import OPS
from tvm_ext import loop_ir as L

R = relax.op


def _graph(mod):
    return DataflowGraph(mod["main"].body.blocks[0])


def _analyze(mod, **rules):
    graph = _graph(mod)
    return graph, AutoFuse(**rules).analyze(graph)


def _kernels(graph, af_or_part):
    part = af_or_part if hasattr(af_or_part, "groups") else af_or_part(graph)
    return [[graph[n].name for n in g.nodes if graph[n].kind == "op"] for g in part.groups]


def _rules(plan):
    return [d.reason.split(":")[0] for d in plan.log]


def _bb():
    return relax.BlockBuilder.current()


# --------------------------------------------------------------------------- the seed's walk-through
def _conv_abs_exp_conv(x, w):
    bb = _bb()
    c1 = bb.emit(R.nn.conv2d(x, w, padding=1), "conv1")
    a = bb.emit(R.abs(c1), "abs")
    e = bb.emit(R.exp(a), "exp")
    return R.nn.conv2d(e, w, padding=1)


WALK_SPECS = [((1, 2, 5, 5), "float32"), ((2, 2, 3, 3), "float32")]


def test_seed_walkthrough_conv_abs_exp_conv():
    # As in the seed, Conv has no lowering: default lowering makes it Extern.
    registry = OPS.without("relax.nn.conv2d")
    mod = build_module(_conv_abs_exp_conv, WALK_SPECS)
    graph = DataflowGraph(mod["main"].body.blocks[0], registry)
    plan = AutoFuse().analyze(graph)
    box = {graph[n].name: b for n, b in plan.boxes.items()}
    assert box["conv1"].kind is BoxKind.EXTERN and box["gv"].kind is BoxKind.EXTERN
    assert box["abs"].kind is BoxKind.FUSABLE  # inlined into exp's box, never computed alone
    assert box["exp"].kind is BoxKind.MEMORY and box["exp"].members == frozenset({1, 2})
    assert box["exp"].rule == "default-lowering"  # the second conv realizes its input
    assert _kernels(graph, AutoFuse()) == [["abs", "exp"]]

    compiled = tvm_ext.compile(mod, registry=registry, strict=True)
    kernels = compiled.report().kernels
    assert [(k.source, k.ops) for k in kernels] == [("tvm", ["conv2d"]), ("ours", ["abs", "exp"]),
                                                    ("tvm", ["conv2d"])]  # one legalized conv, called twice
    x, w = (np.random.default_rng(0).standard_normal(s[0]).astype("float32") * 0.3 for s in WALK_SPECS)
    ours = compiled(x, w)
    plain = tvm_ext.compile(mod, fusion="none", strict=True)(x, w)
    np.testing.assert_allclose(ours, plain, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- recompute
def test_a_value_with_two_readers_is_recomputed_in_each():
    def make(x):
        bb = _bb()
        a = bb.emit(R.abs(x), "a")
        b = bb.emit(R.negative(a), "b")
        c = bb.emit(R.sqrt(a), "c")
        return relax.Tuple([b, c])
    mod = build_module(make, [((4, 16), "float32")])
    graph, plan = _analyze(mod)
    assert _kernels(graph, AutoFuse()) == [["a", "b"], ["a", "c"]]  # 'a' lives in both kernels
    assert [d.reason for d in plan.log if graph[d.node].name == "a"] == \
        ["fusable: into b (recomputed)", "fusable: into c (recomputed)"]
    x = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    b, c = compile_strict(mod, "autofuse")(x)
    np.testing.assert_allclose(b, -np.abs(x))
    np.testing.assert_allclose(c, np.sqrt(np.abs(x)), rtol=1e-6)


def _fanout_chain(levels):
    def make(x):
        bb = _bb()
        y = x
        for i in range(levels):  # each level reads the previous one three times
            y = bb.emit(R.add(R.multiply(R.multiply(y, y), relax.const(0.5, "float32")),
                              R.multiply(y, relax.const(0.25, "float32"))), f"y{i}")
        return y
    return make


def test_fanout_chain_that_explodes_under_naive_recompute_stays_bounded():
    levels = 30
    mod = build_module(_fanout_chain(levels), [((8, 64), "float32")])
    axes = tuple(tvm.tirx.Var(f"i{d}", "int32") for d in range(2))

    def exprs(plan):
        return [b.value.load(axes) for b in plan.boxes.values() if b.value is not None and b.value.buffer is None]

    # Without the size rule the last value inlines all 30 levels: as a tree (naive recompute)
    # that is 3^30 nodes; built with memoized loads it is a DAG of a few nodes per level.
    _, unlimited = _analyze(mod, max_loop_nodes=10 ** 9)
    last = exprs(unlimited)[-1]
    assert L.tree_size(last) > 10 ** 14
    assert L.count_nodes(last) < 10 * levels
    # With it (64 nodes), boxes are realized before they grow past the limit.
    graph, plan = _analyze(mod)
    assert max(L.count_nodes(e) for e in exprs(plan)) <= 2 * AutoFuse().rules.max_loop_nodes
    assert "loop-nodes" in _rules(plan)
    x = np.random.default_rng(0).uniform(0, 0.25, (8, 64)).astype("float32")
    want = x.astype("float64")
    for _ in range(levels):
        want = want * want * 0.5 + want * 0.25
    compiled = compile_strict(mod, "autofuse")
    np.testing.assert_allclose(compiled(x), want, rtol=1e-5, atol=1e-30)
    assert compiled.report().num_kernels < levels


def test_cse_computes_a_recomputed_value_once_per_kernel():
    def make(x):
        bb = _bb()
        e = bb.emit(R.exp(R.sin(x)), "e")  # fusable, read by two readers: recomputed in each ...
        a = bb.emit(R.multiply(e, relax.const(2.0, "float32")), "a")
        b = bb.emit(R.multiply(e, relax.const(3.0, "float32")), "b")
        return R.add(a, b)  # ... which meet again in one kernel: CSE computes it once
    mod = build_module(make, [((4, 32), "float32")])
    compiled = tvm_ext.compile(mod, fusion=AutoFuse(realize_ops=frozenset()), exact_math=True, strict=True)
    (kernel,) = compiled.report().kernels
    assert kernel.loop_ir.count("exp(") == 2  # the expression tree names it twice ...
    assert compiled.lowered_module.script().count("T.exp(") == 1  # ... the kernel computes it once
    x = np.random.default_rng(0).standard_normal((4, 32)).astype("float32")
    np.testing.assert_allclose(compiled(x), 5 * np.exp(np.sin(x)), rtol=1e-6)


# --------------------------------------------------------------------------- stop rules
def test_every_stop_rule_is_documented():
    assert set(STOP_RULES) >= {"reduction", "loop-nodes", "loads", "default-lowering", "anchor-input",
                               "device", "realize-op", "unused-input", "disabled", "scalar-graph", "rollback",
                               "control-edge", "cores", "super-kernel"}


def test_rule_reduction_is_a_kernel_local_stage():
    def make(x):
        bb = _bb()
        s = bb.emit(R.sum(x, axis=[1], keepdims=True), "s")
        return R.divide(x, s)
    graph, plan = _analyze(build_module(make, [((4, 64), "float32")]))
    assert "reduction" in _rules(plan)
    assert _kernels(graph, AutoFuse()) == [["s", "gv"]]


def test_rule_loop_nodes():
    def make(x):
        y = x
        for _ in range(12):
            y = R.nn.relu(R.add(y, relax.const(1.0, "float32")))
        return y
    mod = build_module(make, [((4, 8), "float32")])
    graph, plan = _analyze(mod, max_loop_nodes=10)
    assert "loop-nodes" in _rules(plan)
    assert len(_kernels(graph, AutoFuse(max_loop_nodes=10))) > 1
    assert len(_kernels(graph, AutoFuse())) == 1


def _six_inputs(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = R.add(out, x)
    return out


def test_rule_loads():
    mod = build_module(_six_inputs, [((4, 8), "float32")] * 6)
    graph, plan = _analyze(mod, max_loads=4)
    assert "loads" in _rules(plan)
    assert len(_kernels(graph, AutoFuse(max_loads=4))) == 2
    assert len(_kernels(graph, AutoFuse(max_loads=8))) == 1
    xs = [np.full((4, 8), i, "float32") for i in range(6)]
    np.testing.assert_allclose(tvm_ext.compile(mod, fusion=AutoFuse(max_loads=4), strict=True)(*xs),
                               np.full((4, 8), 15, "float32"))


def test_rule_default_lowering_realizes_the_inputs_of_ops_we_do_not_lower():
    mod = build_module(lambda x: R.nn.relu(R.cumsum(R.exp(x), axis=1)), [((3, 4), "float32")])
    graph, plan = _analyze(mod)
    assert [d.reason.split(":")[0] for d in plan.log if graph[d.node].name == "lv"][-1] == "default-lowering"
    assert _kernels(graph, AutoFuse()) == [["lv"], ["gv"]]


def test_rule_anchor_input():
    mod = build_module(lambda a, b: R.matmul(R.exp(a), R.permute_dims(b)), [((4, 8), "float32"), ((6, 8), "float32")])
    graph, plan = _analyze(mod)
    realized = {graph[d.node].name: d.reason.split(":")[0] for d in plan.log if d.action == "realize"}
    assert realized["lv"] == "anchor-input"  # exp would be recomputed per output column
    assert "lv1" not in realized  # the transpose is a pure view: folded into the matmul's loads
    assert _kernels(graph, AutoFuse()) == [["lv"], ["lv1", "gv"]]


def test_rule_device_labels_split_kernels():
    mod = build_module(lambda x: R.nn.relu(R.exp(x)), [((4, 8), "float32")])
    mod["main"] = mod["main"].with_attr("tvm_ext.ctx_group", {"lv": "dev1", "gv": "dev2"})
    compiled = tvm_ext.compile(mod, strict=True)
    assert compiled.report().num_kernels == 2
    assert any(d.reason.startswith("device: dev1 -> dev2") for d in compiled.report().decisions)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    np.testing.assert_allclose(compiled(x), np.maximum(np.exp(x), 0), rtol=1e-6)


def _exp_two_readers(x):
    bb = _bb()
    e = bb.emit(R.exp(x), "e")
    return R.add(R.multiply(e, e), R.sum(e, axis=[1], keepdims=True))


def test_rule_realize_op_exp_is_a_stage_computed_once():
    mod = build_module(_exp_two_readers, [((4, 64), "float32")])
    graph, plan = _analyze(mod)
    assert "realize-op" in _rules(plan)
    (group,) = AutoFuse()(graph).groups
    assert [graph[n].name for n in group.local] == ["e"]
    (kernel,) = compile_strict(mod, "autofuse").report().kernels
    assert "local e[" in kernel.loop_ir
    _, plan = _analyze(mod, realize_ops=frozenset())
    assert "realize-op" not in _rules(plan)



def _exp_rejoined(x):
    bb = _bb()
    e = bb.emit(R.exp(x), "e")
    n = bb.emit(R.multiply(e, R.add(e, relax.const(2.0))), "n")
    return R.divide(n, R.add(n, relax.const(2.0)))


def _exp_scaled_then_normalized(x):
    bb = _bb()
    e = bb.emit(R.exp(x), "e")
    y = bb.emit(R.multiply(e, relax.const(2.0)), "y")
    return R.divide(y, R.sum(y, axis=[1], keepdims=True))


def test_rule_realize_op_inlines_an_exp_its_elementwise_readers_compute_once():
    # e feeds e + 2 and e * (e + 2), which rejoin into one value, the output: inlined, the
    # kernel's CSE computes e once an element, and no stage of e's size is written and read
    mod = build_module(_exp_rejoined, [((4, 64), "float32")])
    graph, plan = _analyze(mod)
    inlined = [d for d in plan.log if d.reason.startswith("realize-op")]
    assert [(graph[d.node].name, d.action) for d in inlined] == [("e", "inline")]
    (group,) = AutoFuse()(graph).groups
    assert group.local == []
    (kernel,) = compile_strict(mod, "autofuse").report().kernels
    assert "local e[" not in kernel.loop_ir
    x = np.random.default_rng(0).standard_normal((4, 64)).astype("float32")
    e = np.exp(x)
    np.testing.assert_allclose(compile_strict(mod, "autofuse")(x), e * (e + 2) / (e * (e + 2) + 2), rtol=1e-6)
    # y = 2e is read by the sum and by the division, each of which would recompute it: e stays a stage
    mod = build_module(_exp_scaled_then_normalized, [((4, 64), "float32")])
    graph, plan = _analyze(mod)
    (group,) = AutoFuse()(graph).groups
    assert [graph[n].name for n in group.local] == ["e"]
    assert [(graph[d.node].name, d.action) for d in plan.log if d.reason.startswith("realize-op")] == [("e", "stage")]


def test_rule_realize_op_keeps_a_view_alone_as_its_own_kernel():
    # A reshape alone is left to TVM (a zero-copy view) unless the rules ask to realize it.
    mod = build_module(lambda x: R.reshape(x, (8, 4)), [((4, 8), "float32")])
    graph = _graph(mod)
    assert _kernels(graph, AutoFuse()) == []
    assert _kernels(graph, AutoFuse(realize_ops=frozenset(["relax.reshape"]), rollback_threshold=0)) == [["gv"]]

def test_rule_unused_input_is_not_fused_into_its_reader():
    mod = build_module(lambda x, y: R.add(R.zeros_like(R.exp(x)), y), [((4, 8), "float32")] * 2)
    graph, plan = _analyze(mod)
    assert "unused-input" in _rules(plan)
    assert _kernels(graph, AutoFuse()) == [["lv"], ["lv1", "gv"]]


def test_rule_disabled_nodes_keep_their_own_kernel():
    mod = build_module(lambda x: R.nn.relu(R.sqrt(R.exp(x))), [((4, 8), "float32")])
    graph, plan = _analyze(mod, disable_fusion=frozenset({"lv1"}))
    assert "disabled" in _rules(plan)
    assert _kernels(graph, AutoFuse(disable_fusion=frozenset({"lv1"}))) == [["lv"], ["lv1"], ["gv"]]


def _symbol_kernels(net, x):
    af = AutoFuse()
    compiled = tvm_ext.compile(net, [x], fusion=af)
    part_graph = af.plans[-1].graph
    kernels = _kernels(part_graph, af(part_graph))
    return compiled, af.plans[-1], kernels


def test_rule_scopes_disable_and_super_kernel_come_from_attr_scope():
    x = sym.Variable("x")
    a2 = sym.abs(sym.sqrt(x, name="a"), name="a2")
    with sym.AttrScope(_disable_autofuse_scope="1"):
        b = sym.negative(a2, name="b")
    c2 = sym.sin(sym.relu(b, name="c"), name="c2")
    with sym.AttrScope(_super_kernel_scope="sk0"):
        d = sym.tanh(c2, name="d")
    e2 = sym.abs(sym.cos(d, name="e"), name="e2")
    xs = np.random.default_rng(0).uniform(0.1, 2, (8, 32)).astype("float32")
    compiled, plan, kernels = _symbol_kernels(e2, xs)
    assert kernels == [["a", "a2"], ["b"], ["c", "c2"], ["d"], ["e", "e2"]]
    assert [(plan.graph[d.node].name, d.reason) for d in plan.log if d.action == "extern"] == [
        ("b", "disabled"), ("d", "super-kernel")]
    ref = np.abs(np.cos(np.tanh(np.sin(np.maximum(-np.abs(np.sqrt(xs)), 0)))))
    np.testing.assert_allclose(compiled(xs), ref, rtol=1e-5)


def test_rule_core_scope_splits_kernels_and_limits_their_cores():
    x = sym.Variable("x")
    a = sym.sqrt(x, name="a")
    with sym.AttrScope(_core_scope="1"):
        c = sym.relu(sym.abs(a, name="b"), name="c")
    d = sym.sin(c, name="d")
    xs = np.random.default_rng(0).uniform(0.1, 2, (64, 256)).astype("float32")  # big enough to run in parallel
    compiled, plan, kernels = _symbol_kernels(d, xs)
    assert kernels == [["a"], ["b", "c"], ["d"]]
    assert [d.reason for d in plan.log if d.reason.startswith("cores")] == ["cores: all -> 1 cores",
                                                                            "cores: 1 -> all cores"]
    prims = {gv.name_hint: f for gv, f in compiled.lowered_module.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    limited = [n for n, f in prims.items() if f.attrs is not None and "tvm_ext.cores" in f.attrs]
    assert limited == ["fused_abs_relu"] and int(prims[limited[0]].attrs["tvm_ext.cores"]) == 1
    machine_cores = Machine().cores
    for name, f in prims.items():  # the scoped kernel runs on one core; the others use the machine's
        assert ("T.parallel" in f.script()) == (name != "fused_abs_relu" and machine_cores > 1), name
    assert "[1 core]" in str(compiled.report())
    np.testing.assert_allclose(compiled(xs), np.sin(np.maximum(np.abs(np.sqrt(xs)), 0)), rtol=1e-5)


def test_rule_control_edges_keep_their_nodes_in_kernels_of_their_own_and_in_order():
    x = sym.Variable("x")
    b = sym.abs(sym.sqrt(x, name="a"), name="b")
    q = sym.sin(sym.relu(x, name="p"), name="q")
    q._add_control_deps(b)  # q runs after b; without the edge, a and b would fuse, and p and q
    out = sym.add(b, q, name="out")
    assert out.topo_nodes().index(b.topo_nodes()[-1]) < out.topo_nodes().index(q.topo_nodes()[-1])
    again = sym.load_json(out.tojson())
    assert [n.name for n in again.topo_nodes()[-2].control_deps] == ["b"]
    with pytest.raises(tvm_ext.InputError, match="cycle"):
        b._add_control_deps(out)
    xs = np.random.default_rng(0).uniform(0.1, 2, (8, 32)).astype("float32")
    compiled, plan, kernels = _symbol_kernels(out, xs)
    assert kernels == [["a"], ["b"], ["p"], ["q"], ["out"]]
    assert {plan.graph[d.node].name for d in plan.log if d.reason.startswith("control-edge")} >= {"a", "b", "p", "q"}
    calls = [str(b_.value.args[0].name_hint) for blk in compiled.lowered_module["main"].body.blocks
             for b_ in blk.bindings if isinstance(b_.value, relax.Call) and hasattr(b_.value.args[0], "name_hint")]
    kernels_called = [c for c in calls if c.startswith("fused_")]
    assert kernels_called.index("fused_abs") < kernels_called.index("fused_sin")
    np.testing.assert_allclose(compiled(xs), np.abs(np.sqrt(xs)) + np.sin(np.maximum(xs, 0)), rtol=1e-5)


def test_local_stages_false_is_the_seeds_literal_rules_1_and_7():
    x = sym.Variable("x")
    e = sym.exp(x, name="e")
    y = sym.divide(e, sym.sum(e, axis=1, keepdims=True, name="s"), name="y")
    xs = np.random.default_rng(0).standard_normal((16, 64)).astype("float32")
    for rules, expected in ((dict(), [["e", "s", "y"]]), (dict(local_stages=False), [["e"], ["s"], ["y"]])):
        af = AutoFuse(**rules)
        compiled = tvm_ext.compile(y, [xs], fusion=af)
        graph = af.plans[-1].graph
        assert _kernels(graph, af(graph)) == expected
        np.testing.assert_allclose(compiled(xs), np.exp(xs) / np.exp(xs).sum(1, keepdims=True), rtol=1e-5)


def test_rule_unsupported_dtype_skips_lowering():
    mod = build_module(lambda x: R.nn.relu(R.add(x, x)), [((4, 8), "bfloat16")])
    graph, plan = _analyze(mod)
    assert all(b.kind is BoxKind.EXTERN for b in plan.boxes.values())
    assert all("dtype bfloat16" in d.reason for d in plan.log if d.action == "extern")


def test_rule_scalar_graph_is_not_fused():
    mod = build_module(lambda x: R.nn.relu(R.exp(R.add(x, x))), [((), "float32")])
    graph, plan = _analyze(mod)
    assert "scalar-graph" in _rules(plan)
    assert _kernels(graph, AutoFuse()) == [["lv"], ["lv1"], ["gv"]]
    assert _kernels(graph, AutoFuse(fuse_scalar_graphs=True)) == [["lv", "lv1", "gv"]]


def test_rollback_returns_small_kernels_to_one_kernel_per_op():
    mod = build_module(lambda x: R.nn.relu(R.exp(x)), [((4, 8), "float32")])
    graph, plan = _analyze(mod, rollback_threshold=3)
    assert "rollback" in _rules(plan)
    assert _kernels(graph, AutoFuse(rollback_threshold=3)) == [["lv"], ["gv"]]
    assert _kernels(graph, AutoFuse()) == [["lv", "gv"]]  # the default threshold, 2, keeps it
    x = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    np.testing.assert_allclose(tvm_ext.compile(mod, fusion=AutoFuse(rollback_threshold=3))(x),
                               np.maximum(np.exp(x), 0), rtol=1e-6)


# --------------------------------------------------------------------------- multi-stage kernels
def _softmax(x):
    bb = _bb()
    e = bb.emit(R.exp(R.subtract(x, R.max(x, axis=[-1], keepdims=True))))
    return R.divide(e, R.sum(e, axis=[-1], keepdims=True))


def _log_softmax(x):
    bb = _bb()
    s = bb.emit(R.subtract(x, R.max(x, axis=[-1], keepdims=True)))
    return R.subtract(s, R.log(R.sum(R.exp(s), axis=[-1], keepdims=True)))


def _layer_norm(x, g, b):
    bb = _bb()
    mu = bb.emit(R.mean(x, axis=[-1], keepdims=True))
    d = bb.emit(R.subtract(x, mu))
    var = bb.emit(R.mean(R.multiply(d, d), axis=[-1], keepdims=True))
    return R.add(R.multiply(R.divide(d, R.sqrt(R.add(var, relax.const(1e-5, "float32")))), g), b)


def _rms_norm(x, g):
    ms = R.mean(R.multiply(x, x), axis=[-1], keepdims=True)
    return R.multiply(R.multiply(x, R.rsqrt(R.add(ms, relax.const(1e-6, "float32")))), g)


def _chain(x, b):
    return R.subtract(R.nn.relu(R.add(R.multiply(R.sigmoid(x), x), b)), relax.const(0.5, "float32"))


def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


ROWS, COLS = 32, 256
MULTI_STAGE = [
    ("softmax", _softmax, [(ROWS, COLS)], _np_softmax),
    ("log_softmax", _log_softmax, [(ROWS, COLS)], lambda x: np.log(_np_softmax(x))),
    ("layer_norm", _layer_norm, [(ROWS, COLS), (COLS,), (COLS,)],
     lambda x, g, b: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b),
    ("rms_norm", _rms_norm, [(ROWS, COLS), (COLS,)],
     lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g),
    ("pointwise_chain", _chain, [(ROWS, COLS), (COLS,)],
     lambda x, b: np.maximum(x / (1 + np.exp(-x)) + b, 0) - 0.5),
]


@pytest.mark.parametrize("name,make,shapes,ref", MULTI_STAGE, ids=[m[0] for m in MULTI_STAGE])
def test_memory_bound_graph_is_one_kernel_reading_its_input_once(name, make, shapes, ref):
    mod = build_module(make, [(s, "float32") for s in shapes])
    compiled = compile_strict(mod, "autofuse")
    (kernel,) = compiled.report().kernels
    assert kernel.bytes_read == sum(math.prod(s) for s in shapes) * 4  # every input once
    assert kernel.bytes_written == ROWS * COLS * 4  # the output once
    inputs = [np.random.default_rng(i).standard_normal(s).astype("float32") for i, s in enumerate(shapes)]
    np.testing.assert_allclose(compiled(*inputs), ref(*inputs), rtol=2e-5, atol=2e-5)


# --------------------------------------------------------------------------- ConcretizeBroadcast
def _broadcast_into_matmul(a, w):
    bb = _bb()
    wb = bb.emit(R.broadcast_to(R.expand_dims(w, [0]), (3, 8, 5)))
    return R.matmul(a, wb)


def test_broadcasts_are_folded_into_their_reader():
    mod = build_module(_broadcast_into_matmul, [((3, 4, 8), "float32"), ((8, 5), "float32")])
    graph = _graph(mod)
    assert [graph[n].name for n in range(len(graph)) if is_broadcast_view(graph[n])] == ["lv", "lv1"]
    nnvm = FusePartition()(graph)
    assert len(nnvm.groups) == 2  # NNVM alone: a broadcast kernel, then the matmul
    concretized = concretize_broadcast(nnvm)
    assert _kernels(graph, concretized) == [["lv", "lv1", "gv"]]
    for fusion in ("nnvm", "autofuse"):
        compiled = compile_strict(mod, fusion)
        assert all(not set(k.ops) <= {"broadcast_to", "expand_dims", "squeeze", "reshape"}
                   for k in compiled.report().kernels)
        a = np.random.default_rng(0).standard_normal((3, 4, 8)).astype("float32")
        w = np.random.default_rng(1).standard_normal((8, 5)).astype("float32")
        np.testing.assert_allclose(compiled(a, w), a @ w, rtol=1e-5, atol=1e-5)


def test_a_broadcast_that_is_a_graph_output_is_materialized():
    mod = build_module(lambda x: R.broadcast_to(x, (4, 3)), [((3,), "float32")])
    graph = _graph(mod)
    assert len(partition_nnvm(graph).groups) == 1
    np.testing.assert_array_equal(compile_strict(mod, "nnvm")(np.arange(3, dtype="float32")),
                                  np.broadcast_to(np.arange(3, dtype="float32"), (4, 3)))


# --------------------------------------------------------------------------- strategies
@pytest.mark.parametrize("fusion", ["autofuse", "nnvm", "tvm", "none"])
def test_every_strategy_compiles_the_same_model(fusion):
    mod = build_module(_layer_norm, [((ROWS, COLS), "float32"), ((COLS,), "float32"), ((COLS,), "float32")])
    inputs = [np.random.default_rng(i).standard_normal(s).astype("float32") for i, s in
              enumerate([(ROWS, COLS), (COLS,), (COLS,)])]
    x, g, b = inputs
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b
    compiled = tvm_ext.compile(mod, fusion=fusion)
    np.testing.assert_allclose(compiled(*inputs), want, rtol=2e-5, atol=2e-5)
    counts = {"autofuse": 1, "nnvm": 4, "tvm": 3}
    if fusion in counts:
        assert compiled.report().num_kernels == counts[fusion]


def test_a_reader_that_would_close_a_cycle_between_kernels_starts_its_own():
    # s is a stage of kernel K; f, in K, is read by sort (TVM's kernel, after K). r reads s and
    # the sort: joined to K, K would both feed the sort and wait for it.
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(R.sum(x, axis=[1], keepdims=True))
            f = bb.emit(R.divide(x, s))
            z = bb.emit(R.sort(f, axis=1))
            r = bb.emit_output(R.multiply(s, z))
        bb.emit_func_output(r)
    compiled = tvm_ext.compile(bb.get(), fusion="autofuse")
    report = compiled.report()
    assert "realize kernel-merge: for gv" in report.decisions_text()  # s is written out for r
    assert [k.ops for k in report.kernels] == [["sum", "divide"], ["multiply"]]  # (+ TVM's sort)
    xs = np.random.default_rng(0).random((8, 16)).astype("float32") + 0.5
    sums = xs.sum(1, keepdims=True)
    np.testing.assert_allclose(compiled(xs), sums * np.sort(xs / sums, axis=1), rtol=1e-6)


def test_a_reader_that_cannot_join_all_its_kernels_joins_the_newest_it_can():
    # a pre-norm block's residual: gv = a + m2, where a = x + 1 feeds softmax -> matmul -> relu ->
    # matmul (m2). Joining a's computation and m2's kernel would close a cycle through the first
    # matmul's kernel; gv joins m2's kernel alone and reads a from memory (before: a kernel of
    # its own for gv, reading a and m2 back: 5 kernels, now 4)
    def make(x, w1, w2):
        a = R.add(x, relax.const(1.0, "float32"))
        return R.add(a, R.matmul(R.nn.relu(R.matmul(R.nn.softmax(a, axis=-1), w1)), w2))
    mod = build_module(make, [((64, 128), "float32"), ((128, 128), "float32"), ((128, 128), "float32")])
    compiled = tvm_ext.compile(mod, fusion="autofuse")
    report = compiled.report()
    assert [k.ops for k in report.kernels] == [["add"], ["add", "nn.softmax"], ["matmul", "nn.relu"], ["matmul", "add"]]
    log = report.decisions_text()
    assert "lv add                      realize kernel-merge: for gv" in log
    assert "matmul                   realize kernel-merge" not in log
    rng = np.random.default_rng(0)
    x, w1, w2 = (rng.standard_normal(s).astype("float32") for s in [(64, 128), (128, 128), (128, 128)])
    a = x + 1
    e = np.exp(a - a.max(-1, keepdims=True))
    np.testing.assert_allclose(compiled(x, w1, w2), a + np.maximum(e / e.sum(-1, keepdims=True) @ w1, 0) @ w2,
                               rtol=1e-5, atol=1e-5)


def test_kernels_merged_around_a_multi_output_node_renumber_its_boxes_too():
    # topk's two outputs share one node, whose boxes are a list: the merge of the sum's kernel
    # with the mean's (both read by `a`) must renumber them as it does single boxes
    def make(x):
        bb = _bb()
        a = bb.emit(R.add(bb.emit(R.sum(x, axis=[1], keepdims=True)), bb.emit(R.mean(x, axis=[0]))))
        t = bb.emit(R.topk(x, k=1, axis=-1, ret_type="both", dtype="int64"))
        return R.add(a, bb.emit(relax.TupleGetItem(t, 0)))
    compiled = tvm_ext.compile(build_module(make, [((5, 17), "float32")]), fusion="autofuse")
    assert [k.ops for k in compiled.report().kernels] == [["sum", "mean", "add", "topk", "add"]]
    xs = np.random.default_rng(0).standard_normal((5, 17)).astype("float32")
    expected = xs.sum(1, keepdims=True) + xs.mean(0) + xs.max(1, keepdims=True)
    np.testing.assert_allclose(compiled(xs), expected, rtol=1e-5, atol=1e-5)
