"""PlanMemory on small graphs whose plans were worked out by hand, and the compiled results.

Every intermediate below is a (16, 16) float32 tensor: 1024 bytes, one storage unit. Kernels
are one op each (``fusion="none"``), so the plan is the seed's algorithm on the op graph.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_ext
from tvm_ext import models
from conftest import build_module
from relay_passes.plan_memory import (PAGE, BestFit, FunctionGraph, Step, Value, _chains, _place, best_plan,
                                      lower_bound, pack_offsets, plan_function, plan_graph)
from tvm_ext.build_pipeline import before_planning
from tvm_ext.pipeline import Pipeline

R = relax.op
UNIT = 16 * 16 * 4
SPEC = [((16, 16), "float32")]


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def planned(make, specs=SPEC, fusion="none"):
    """(graph, plan, compiled) of ``main = make(*inputs)``."""
    mod = build_module(make, specs)
    pipeline = Pipeline(fusion=fusion)
    compiled = pipeline.run(mod)
    with pipeline.target:
        vm_mod = tvm.transform.Sequential(before_planning())(compiled.lowered_module)
    _, graph, plan, _ = plan_function(vm_mod)
    return graph, plan, compiled


def run(compiled, *xs):
    return compiled(*xs)


@pytest.fixture
def x(rng):
    return rng.standard_normal((16, 16)).astype("float32")


def test_a_chain_alternates_two_blocks(x):
    # a = sm(x), b = sm(a), c = sm(b), out = sm(c): a and b are live together; c takes a's block
    graph, plan, compiled = planned(lambda v: R.nn.softmax(R.nn.softmax(R.nn.softmax(R.nn.softmax(v)))))
    a, b, c = sorted((v for v in graph.values if not v.output), key=lambda v: v.defined)
    assert plan.offset_of[a] == plan.offset_of[c] != plan.offset_of[b]
    assert plan.total == 2 * UNIT and plan.inplace == 0
    memory = compiled.report().memory
    assert (memory.planned, memory.naive, memory.lower_bound) == (2 * UNIT, 3 * UNIT, 2 * UNIT)
    assert memory.tvm_static is not None and memory.planned <= memory.tvm_static
    np.testing.assert_allclose(run(compiled, x), _softmax(_softmax(_softmax(_softmax(x)))), rtol=1e-5, atol=1e-7)


def test_a_diamond_keeps_both_branches_and_joins_in_place(x):
    # a = sm(x); b = sm(a); c = sm(a); d = b + c; out = sm(d)
    # a, b, c are live while c is computed (3 blocks); d is written over b, its last reader
    def make(v):
        a = R.nn.softmax(v)
        return R.nn.softmax(R.add(R.nn.softmax(a, axis=0), R.nn.softmax(a, axis=1)))
    graph, plan, compiled = planned(make)
    inner = sorted((v for v in graph.values if not v.output), key=lambda v: v.defined)
    a, b, c, d = inner
    assert len({plan.offset_of[v] for v in (a, b, c)}) == 3
    assert plan.offset_of[d] in (plan.offset_of[b], plan.offset_of[c])
    assert plan.inplace == 1 and plan.total == 3 * UNIT
    assert compiled.report().memory.lower_bound == 3 * UNIT
    a_ = _softmax(x)
    want = _softmax(_softmax(a_.T).T + _softmax(a_))
    np.testing.assert_allclose(run(compiled, x), want, rtol=1e-5, atol=1e-6)


def test_an_elementwise_chain_runs_in_one_block_in_place(x):
    # a = sm(x); b = exp(a) over a; c = tanh(b) over b; out = sigmoid(c), an output, not planned
    graph, plan, compiled = planned(lambda v: R.sigmoid(R.tanh(R.exp(R.nn.softmax(v)))))
    assert plan.total == UNIT and plan.inplace == 2
    memory = compiled.report().memory
    assert memory.planned == UNIT < memory.lower_bound == 2 * UNIT  # in place beats the liveness bound
    assert memory.naive == 3 * UNIT
    want = 1 / (1 + np.exp(-np.tanh(np.exp(_softmax(x)))))
    np.testing.assert_allclose(run(compiled, x), want, rtol=1e-5, atol=1e-6)


def test_a_graph_output_is_never_planned_nor_written_over(x):
    # y = exp(sm(x)) is returned and also read by z = sm(y): y gets its own destination; z
    # (an output too) may not be written over it
    def make(v):
        y = R.exp(R.nn.softmax(v))
        return relax.Tuple([y, R.negative(y)])
    graph, plan, compiled = planned(make)
    outputs = [v for v in graph.values if v.output]
    assert len(outputs) == 2 and not any(v in plan.offset_of for v in outputs)
    assert plan.inplace == 0  # neither exp over sm's value (exp's output is an output) nor neg over y
    assert compiled.entry is not None and len(compiled.entry.outputs) == 2
    y, z = run(compiled, x)
    np.testing.assert_allclose(y, np.exp(_softmax(x)), rtol=1e-6)
    np.testing.assert_allclose(z, -np.exp(_softmax(x)), rtol=1e-6)
    assert not np.shares_memory(y, z)


def test_a_value_read_by_two_kernels_is_overwritten_only_by_its_last_reader(x):
    # a = sm(x); b = exp(a) (a still read later: own block); c = tanh(a) over a; out = b * c
    def make(v):
        a = R.nn.softmax(v)
        return R.multiply(R.exp(a), R.tanh(a))
    graph, plan, compiled = planned(make)
    a, b, c = sorted((v for v in graph.values if not v.output), key=lambda v: v.defined)
    assert plan.offset_of[b] != plan.offset_of[a]
    assert plan.offset_of[c] == plan.offset_of[a]
    assert plan.inplace == 1 and plan.total == 2 * UNIT
    a_ = _softmax(x)
    np.testing.assert_allclose(run(compiled, x), np.exp(a_) * np.tanh(a_), rtol=1e-5, atol=1e-7)


def test_a_value_nothing_reads_is_freed_at_once():
    # step 0 writes a (read by step 1) and u (read by nobody); step 1 writes b: b takes u's block
    a, u, b, out = (Value(relax.Var(n), UNIT, (16, 16), "float32") for n in "aubo")
    out.output = True
    s0 = Step(0, "k0", [frozenset(), frozenset([a]), frozenset([u])], writes=[a, u])
    s1 = Step(1, "k1", [frozenset([a]), frozenset([b])], reads=[a], writes=[b])
    s2 = Step(2, "k2", [frozenset([b]), frozenset([out])], reads=[b], writes=[out])
    a.defined, u.defined, b.defined, out.defined = 0, 0, 1, 2
    a.readers, b.readers = [1], [2]
    graph = FunctionGraph([s0, s1, s2], [a, u, b, out], [frozenset([out])])
    plan = plan_graph(graph, {}, match_range=1)
    assert plan.offset_of[b] == plan.offset_of[u] != plan.offset_of[a]
    assert plan.total == 2 * UNIT and lower_bound(graph) == 2 * UNIT


def _small_then_big() -> tuple[FunctionGraph, Value, Value]:
    """Step 0 writes a (1000 bytes), step 1 writes b (5000 bytes), step 2 reads both."""
    a, b, out = Value(relax.Var("a"), 1000, (250,), "float32"), Value(relax.Var("b"), 5000, (1250,), "float32"), \
        Value(relax.Var("o"), 4, (1,), "float32")
    out.output = True
    steps = [Step(0, "k0", [frozenset([a])], writes=[a]), Step(1, "k1", [frozenset([b])], writes=[b]),
             Step(2, "k2", [frozenset([a]), frozenset([b]), frozenset([out])], reads=[a, b], writes=[out])]
    a.defined, b.defined, out.defined, a.readers, b.readers = 0, 1, 2, [2], [2]
    return FunctionGraph(steps, [a, b, out], [frozenset([out])]), a, b


def test_a_tensor_of_a_page_or_more_takes_whole_pages_and_starts_on_one():
    # a rounds to 1024 bytes (cache lines), b to 8192 (two pages). Best-fit makes a's block
    # first (0) and b's second; laid end to end as made, b would start at 1024: page blocks go
    # first instead, b at 0 and a at 8192. Packed by offset, b (the larger) is placed first;
    # in an order with a first, b goes to the next page boundary (4096), not to a's end (1024).
    graph, a, b = _small_then_big()
    assert (a.size, b.size) == (1024, 2 * PAGE)
    blocks = plan_graph(graph, {}, match_range=1)
    assert (blocks.offset_of[b], blocks.offset_of[a], blocks.total) == (0, 2 * PAGE, 2 * PAGE + 1024)
    packed = pack_offsets(graph, {})
    assert (packed.offset_of[b], packed.offset_of[a], packed.total) == (0, 2 * PAGE, 2 * PAGE + 1024)
    _, spans = _chains(graph, {})
    offsets, total = _place([a, b], spans)
    assert (offsets[a], offsets[b], total) == (0, PAGE, 3 * PAGE)


def test_every_planned_tensor_of_a_page_or_more_starts_on_a_page(rng):
    # (3, 500) float32 is 6000 bytes: intermediates of that size beside a 12-byte row sum
    def make(v):
        s = R.sum(v, axis=[1], keepdims=True)
        a = R.exp(R.divide(v, s))
        return R.nn.softmax(R.multiply(a, R.tanh(a)))
    x = rng.uniform(0.5, 1.0, (3, 500)).astype("float32")
    graph, plan, compiled = planned(make, specs=[((3, 500), "float32")])
    big = [v for v in graph.values if v in plan.offset_of and v.nbytes >= PAGE]
    assert len(big) >= 2 and any(v.nbytes < PAGE for v in plan.offset_of)
    assert all(plan.offset_of[v] % PAGE == 0 for v in big), {v.var.name_hint: plan.offset_of[v] for v in big}
    a = np.exp(x / x.sum(1, keepdims=True))
    np.testing.assert_allclose(run(compiled, x), _softmax(a * np.tanh(a)), rtol=1e-5, atol=1e-7)


def test_best_fit_takes_the_smallest_larger_block_then_enlarges_a_smaller_one():
    alloc = BestFit(match_range=4)
    big, small = alloc.request(4096), alloc.request(1024)
    alloc.release(big)
    alloc.release(small)
    assert alloc.request(1000) == small  # the smallest block >= 1000 within [250, 4000]
    assert alloc.request(2048) == big  # 4096 in [512, 8192]
    alloc.release(small)
    assert alloc.request(3000) == small and alloc.sizes[small] == 3000  # no larger block: enlarged
    assert alloc.request(100000) == 2 and alloc.total == 4096 + 3000 + 100000
    exact = BestFit(match_range=1)
    block = exact.request(1024)
    exact.release(block)
    assert exact.request(1000) != block  # m = 1 reuses exact sizes only


def test_match_range_sweep_keeps_the_smallest_total():
    # x1 (1 unit) dies before x3 (3 units) is written. m = 1 or 2 cannot hand x1's block to x3
    # (outside [3/m, 3m] units): 4 units. m >= 3 enlarges it: 3 units, the lower bound.
    x1, x3, out = (Value(relax.Var(n), s * UNIT, (s * 16, 16), "float32") for n, s in (("a", 1), ("b", 3), ("o", 1)))
    out.output = True
    steps = [Step(0, "k0", [frozenset([x1])], writes=[x1]),
             Step(1, "k1", [frozenset([x1])], reads=[x1]),
             Step(2, "k2", [frozenset([x3])], writes=[x3]),
             Step(3, "k3", [frozenset([x3]), frozenset([out])], reads=[x3], writes=[out])]
    x1.defined, x1.readers, x3.defined, x3.readers, out.defined = 0, [1], 2, [3], 3
    graph = FunctionGraph(steps, [x1, x3, out], [frozenset([out])])
    assert [plan_graph(graph, {}, m).total for m in (1, 2, 3)] == [4 * UNIT, 4 * UNIT, 3 * UNIT]
    best = best_plan(graph, lambda *_: False)
    assert (best.total, best.allocator, best.match_range) == (3 * UNIT, "best-fit", 3)
    assert lower_bound(graph) == 3 * UNIT


def test_offsets_pack_what_whole_blocks_cannot():
    # a (2 units) lives over steps 0-1, b (1) over 1-2, c (2) over 2-3, d (1) over 3-4.
    # Whole blocks: c cannot take a's block while b... it can (a is dead at 2): best-fit does
    # a|b then c->a, d->b: 3 units. Offsets do the same; the bound is 3 units too.
    # With e (1 unit) over 0-4 beside them, blocks give 4 units and so do offsets: both at the bound.
    vals = {n: Value(relax.Var(n), s * UNIT, (s * 16, 16), "float32") for n, s in
            (("a", 2), ("b", 1), ("c", 2), ("d", 1), ("e", 1), ("o", 1))}
    vals["o"].output = True
    life = {"a": (0, 1), "b": (1, 2), "c": (2, 3), "d": (3, 4), "e": (0, 4)}
    steps = [Step(i, f"k{i}", []) for i in range(5)]
    for n, (first, last) in life.items():
        v = vals[n]
        v.defined, v.readers = first, [last]
        steps[first].writes.append(v)
        steps[first].args.append(frozenset([v]))
        steps[last].reads.append(v)
        steps[last].args.append(frozenset([v]))
    graph = FunctionGraph(steps, list(vals.values())[:-1], [])
    packed = pack_offsets(graph, {})
    assert packed.total == lower_bound(graph) == 4 * UNIT
    for x, y in [("a", "b"), ("b", "c"), ("c", "d"), ("a", "e"), ("c", "e")]:  # overlapping in time
        ox, oy = packed.offset_of[vals[x]], packed.offset_of[vals[y]]
        assert ox + vals[x].size <= oy or oy + vals[y].size <= ox, (x, y)


def test_an_input_read_only_for_its_shape_holds_no_count(x):
    # a = sm(x); z = zeros_like(a) reads only a's shape; out = sm(a) + z. a's last real reader is sm
    def make(v):
        a = R.nn.softmax(v)
        return R.add(R.nn.softmax(a), R.zeros_like(a))
    graph, plan, compiled = planned(make)
    a = min((v for v in graph.values if not v.output), key=lambda v: v.defined)
    kernels = [graph.steps[i].kernel for i in a.readers]
    assert not any("zeros" in k for k in kernels)
    np.testing.assert_allclose(run(compiled, x), _softmax(_softmax(x)), rtol=1e-5, atol=1e-7)


def test_the_shape_only_fact_comes_from_the_kernel_attribute_fusecompile_writes(x):
    """FuseCompile writes zeros_like's OpDef.shape_only on its kernel (tvm_ext.shape_only = [0]);
    PlanMemory counts by it: with the attribute emptied, the zeros kernel holds a count on a."""
    def make(v):
        a = R.nn.softmax(v)
        return R.add(R.nn.softmax(a), R.zeros_like(a))
    mod = build_module(make, SPEC)
    pipeline = Pipeline(fusion="none")
    lowered = pipeline.run(mod).lowered_module
    (zeros,) = [gv for gv, f in lowered.functions.items() if "zeros" in gv.name_hint]
    assert [int(i) for i in lowered[zeros].attrs[tvm_ext.attrs.SHAPE_ONLY]] == [0]

    def readers_of_a(module):
        with pipeline.target:
            vm_mod = tvm.transform.Sequential(before_planning())(module)
        _, graph, _, _ = plan_function(vm_mod)
        a = min((v for v in graph.values if not v.output), key=lambda v: v.defined)
        return [graph.steps[i].kernel for i in a.readers]

    assert not any("zeros" in k for k in readers_of_a(lowered))
    lowered[zeros] = lowered[zeros].with_attr(tvm_ext.attrs.SHAPE_ONLY, [])
    assert any("zeros" in k for k in readers_of_a(lowered))


@pytest.mark.parametrize("fusion", ["autofuse", "nnvm", "none"])
@pytest.mark.parametrize("name", sorted(models.BUILTIN_MODELS))
def test_builtin_models_are_planned_within_the_bounds_and_unchanged(name, fusion):
    model = models.BUILTIN_MODELS[name]() if name != "transformer_block" else \
        models.transformer_block(batch=2, seq=16, dim=32, heads=2, ffn=64)
    small = {"elementwise_chain": dict(n=1 << 14), "softmax": dict(rows=64, cols=128),
             "layer_norm": dict(rows=64, cols=96)}
    if name in small:
        model = models.BUILTIN_MODELS[name](**small[name])
    compiled = tvm_ext.compile(model.mod, fusion=fusion)
    memory = compiled.report().memory
    assert memory.planned <= memory.tvm_static
    assert memory.planned <= 1.1 * memory.lower_bound
    got = compiled(*model.inputs)
    np.testing.assert_allclose(got[0] if isinstance(got, tuple) else got, model.reference(*model.inputs),
                               rtol=2e-5, atol=2e-5)


def test_a_memory_aware_order_runs_the_kernel_that_frees_the_most_first(x):
    # bindings as emitted: a = sm(x), b = sm(x, axis 0), c = sum(a), d = sum(b), out = c + d.
    # In that order a, b and c are live together (2 KiB + 64 B). Running c before b frees a
    # first: the bound (and the plan) fall to b, c, d = 1 KiB + 128 B.
    v = relax.Var("x", relax.TensorType((16, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [v]):
        with bb.dataflow():
            a = bb.emit(R.nn.softmax(v, axis=1))
            b = bb.emit(R.nn.softmax(v, axis=0))
            c = bb.emit(R.sum(a, axis=[1]))
            d = bb.emit(R.sum(b, axis=[1]))
            out = bb.emit_output(R.add(c, d))
        bb.emit_func_output(out)
    compiled = tvm_ext.compile(bb.get(), fusion="none")
    memory = compiled.report().memory
    assert memory.order.startswith("memory-aware")
    assert memory.program_order_bound == 2 * UNIT + 64
    assert memory.lower_bound == memory.planned == UNIT + 128
    np.testing.assert_allclose(compiled(x), _softmax(x).sum(1) + _softmax(x.T).T.sum(1), rtol=1e-5)


@pytest.mark.parametrize("fusion", ["autofuse", "nnvm", "none"])
def test_an_mlp_training_step_is_planned_in_half_its_naive_bytes(fusion):
    # bench/memory.py's training step (256x784 -> 512 -> 10, softmax cross-entropy, SGD momentum);
    # relu's backward reads a boolean mask, which costs a quarter of a float one
    import tvm_ext.symbol as sym
    from tvm_ext.training import SGD, Trainer

    data, label = sym.Variable("data"), sym.Variable("label")
    fc1 = sym.FullyConnected(data, num_hidden=512, name="fc1")
    fc2 = sym.FullyConnected(sym.relu(fc1), num_hidden=10, name="fc2")
    loss = -sym.mean(sym.sum(sym.log_softmax(fc2, axis=-1) * label, axis=[1]))
    trainer = Trainer(loss, ["data", "label"], SGD(0.1, momentum=0.9),
                      shapes={"data": (256, 784), "label": (256, 10)}, fusion=fusion)
    memory = trainer.compiled[0].report().memory
    assert memory.planned <= 0.5 * memory.naive
    assert memory.planned <= memory.tvm_static and memory.planned <= 1.1 * memory.lower_bound


def test_main_calls_the_planned_entry_so_the_weights_are_in_the_executable_once(rng):
    # main allocates a workspace and the outputs and calls main_planned: the kernels (and the
    # constants they read) appear only in main_planned's code
    w = rng.standard_normal((64, 64)).astype("float32")
    compiled = tvm_ext.compile(build_module(lambda v: R.nn.relu(R.matmul(v, relax.const(w))), [((8, 64), "float32")]))
    text = compiled.executable.as_text()
    main, planned = text.split("@main_planned:")[0].split("@main:")[1], text.split("@main_planned:")[1]
    assert "call  main_planned" in main and "fused_" not in main
    assert "fused_" in planned
    x = rng.standard_normal((8, 64)).astype("float32")
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    got = (out[0] if not hasattr(out, "numpy") else out).numpy()
    np.testing.assert_allclose(got, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(compiled(x), got, rtol=0, atol=0)
