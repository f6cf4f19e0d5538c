"""PlaceDevice: placements and copies on small graphs worked out by hand, the seed's example
with its gradient node by node, numerics on two CPU devices, and clear errors for bad input."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import tvm_ext
from relay_passes.gradient import Gradient
from relay_passes.place_device import PlaceDevice, PlacementError, parse_device
from tvm_ext import CompileError, InputError, sym
from tvm_ext.registry import OPS

R = relax.op
TWO = {"dev1": "cpu:0", "dev2": {"device": "cpu:1", "target": "x86-64"}}  # cpu:1 built for a generic x86-64


def _module(build, shape=(4, 8)):
    """A one-input function ``build(bb, x)`` returns the result of."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(build(bb, x))
        bb.emit_func_output(gv)
    return bb.get()


def _placed(mod, group2ctx, labels):
    place = PlaceDevice(group2ctx, labels)
    out = place(mod)
    return place, out, {d.node: (d.device, d.reason) for d in place.decisions}


def _copies(place):
    return sorted((c.value, c.source, c.destination) for c in place.copies)


def test_a_chain_across_two_devices_and_an_unlabelled_node_placed_forward():
    def build(bb, x):
        a = bb.emit(R.exp(x), "a")
        b = bb.emit(R.negative(a), "b")
        return R.sqrt(b)  # unlabelled: the device of its input
    place, out, where = _placed(_module(build), TWO, {"a": "dev1", "b": "dev2"})
    assert where["x"][0] == "cpu:0" and where["a"] == ("cpu:0", "labelled dev1")
    assert where["b"] == ("cpu:1", "labelled dev2")
    assert where["gv"] == ("cpu:1", "from input b")
    # a crosses to cpu:1, and the result comes back to the caller's device
    assert _copies(place) == [("a", "cpu:0", "cpu:1"), ("gv", "cpu:1", "cpu:0")]
    assert all(c.nbytes == 4 * 8 * 4 for c in place.copies)
    text = out["main"].script()
    assert text.count("R.to_vdevice") == 2


def test_a_value_read_on_two_devices_gets_two_copies_and_two_readers_on_one_device_share_one():
    def build(bb, x):
        a = bb.emit(R.exp(x), "a")
        b = bb.emit(R.negative(a), "b")
        c = bb.emit(R.sqrt(a), "c")
        d = bb.emit(R.add(b, c), "d")
        return R.multiply(d, a)
    three = {"dev1": "cpu:1", "dev2": "cpu:2"}
    place, _, where = _placed(_module(build), three, {"b": "dev1", "c": "dev2", "d": "dev1"})
    assert where["a"] == ("cpu:0", "default device") or where["a"][0] == "cpu:0"
    # a: one copy to cpu:1 (read there by b and, through gv, by the multiply) and one to cpu:2
    copies = _copies(place)
    assert copies.count(("a", "cpu:0", "cpu:1")) == 1 and ("a", "cpu:0", "cpu:2") in copies
    assert ("c", "cpu:2", "cpu:1") in copies and where["gv"] == ("cpu:1", "from input d")
    two_readers = {"dev1": "cpu:1"}
    place, _, _ = _placed(_module(build), two_readers, {"b": "dev1", "c": "dev1", "d": "dev1"})
    assert [c for c in _copies(place) if c[0] == "a"] == [("a", "cpu:0", "cpu:1")]  # b and c share it


def _seed_example():
    a, b, c = sym.Variable("a"), sym.Variable("b"), sym.Variable("c")
    with sym.AttrScope(ctx_group="dev1"):
        net = sym.multiply(a, b, name="mul")
    with sym.AttrScope(ctx_group="dev2"):
        net = sym.add(net, c, name="plus")
    return sym.sum(net, name="loss")


def test_the_seeds_example_with_its_gradient_matches_the_seeds_figure():
    mod = _seed_example().to_relax(shapes={"a": (10, 10), "b": (10, 10), "c": (10, 10)})
    grad = Gradient(adjoint_name="main")(mod)
    before = grad["main"]
    place, out, where = _placed(grad, TWO, None)
    assert tvm_ffi.structural_equal(grad["main"], before)  # add only, never modify: the input is unchanged
    fwd = {n: where[n][0] for n in ("mul", "plus", "loss")}
    assert fwd == {"mul": "cpu:0", "plus": "cpu:1", "loss": "cpu:1"}
    backward = {n: d for n, d in where.items() if d[1].startswith("reverse pass")}
    assert backward, where
    # the add's backward (and the sum's) run on dev2, the multiply's on dev1, placed in reverse
    for node, (device, reason) in backward.items():
        forward = reason.rsplit(" ", 1)[-1]
        assert device == where[forward][0], (node, reason)
    assert any(r.endswith("of mul") and d == "cpu:0" for d, r in backward.values())
    assert any(r.endswith(("of plus", "of loss")) and d == "cpu:1" for d, r in backward.values())
    copies = _copies(place)
    # c and a*b go to dev2; what the multiply's gradient needs comes back to dev1
    assert ("c", "cpu:0", "cpu:1") in copies and ("mul", "cpu:0", "cpu:1") in copies
    assert any(src == "cpu:1" and dst == "cpu:0" and v not in ("loss",) for v, src, dst in copies)


def test_the_seeds_example_runs_on_two_cpu_devices_equal_to_numpy():
    shapes = {"a": (10, 10), "b": (10, 10), "c": (10, 10)}
    net = _seed_example()
    x, y, z = (np.random.default_rng(i).standard_normal((10, 10)).astype("float32") for i in range(3))
    compiled = tvm_ext.compile(net, shape_dict=shapes, group2ctx=TWO)
    np.testing.assert_allclose(np.asarray(compiled(x, y, z)), (x * y + z).sum(), rtol=1e-5)
    report = compiled.report()
    assert {k.device for k in report.kernels} == {"cpu:0", "cpu:1"}
    assert {(c["value"], c["destination"]) for c in report.copies} >= {("c", "cpu:1"), ("mul", "cpu:1")}
    assert "copy mul: cpu:0 -> cpu:1, 400 B" in str(report)
    assert any(d.action == "place" and d.reason == "cpu:1: labelled dev2" for d in report.decisions)
    assert report.memory is not None and set(report.memory.per_device) <= {"cpu:0", "cpu:1"}

    grad_mod = Gradient(adjoint_name="main")(net.to_relax(shapes=shapes))
    trained = tvm_ext.compile(grad_mod, group2ctx=TWO)
    loss, (ga, gb, gc) = trained(x, y, z)
    np.testing.assert_allclose(np.asarray(loss), (x * y + z).sum(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ga), y, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gb), x, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gc), np.ones_like(z))
    kernels = trained.report().kernels
    assert {k.device for k in kernels} == {"cpu:0", "cpu:1"}
    # fusion never crosses devices: no kernel holds both the multiply and the add
    assert not any("multiply" in k.ops and "add" in k.ops and k.device == "cpu:0" for k in kernels)


def test_a_torch_model_is_placed_by_a_name_map():
    import torch

    class Two(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(torch.exp(x) * 2.0)

    x = np.random.default_rng(3).standard_normal((6, 5)).astype("float32")
    plain = tvm_ext.compile(Two(), (torch.from_numpy(x),))
    names = [b.var.name for blk in plain.lowered_module["main"].body.blocks for b in blk.bindings]
    assert names
    first = tvm_ext.frontends.import_model(Two(), (torch.from_numpy(x),))
    node = [b.var.name for blk in first["main"].body.blocks for b in blk.bindings][0]
    compiled = tvm_ext.compile(Two(), (torch.from_numpy(x),), group2ctx={"side": "cpu:1"},
                               device_labels={node: "side"})
    np.testing.assert_allclose(compiled(x), np.tanh(np.exp(x) * 2), rtol=1e-5)
    assert "cpu:1" in {k.device for k in compiled.report().kernels}


def test_an_op_that_mutates_an_input_on_another_device_is_rejected():
    registry = OPS.without("relax.add")
    registry.register(dataclasses.replace(OPS["relax.add"], mutates=(0,)))

    def build(bb, x):
        a = bb.emit(R.exp(x), "a")
        return R.add(a, x)
    with pytest.raises(PlacementError, match="node 'gv' .* mutates its input 'a' in place, but runs on cpu:1 "
                                             "while 'a' lives on cpu:0"):
        PlaceDevice({"dev2": "cpu:1"}, {"gv": "dev2"}, registry=registry)(_module(build))
    # the same op on one device is fine
    PlaceDevice({"dev2": "cpu:1"}, {"gv": "dev2", "a": "dev2"}, registry=registry)(_module(build))


def test_in_place_reuse_and_storage_never_span_two_devices():
    def build(bb, x):
        a = bb.emit(R.exp(x), "a")
        b = bb.emit(R.negative(a), "b")  # in place over a, on cpu:0
        c = bb.emit(R.exp(b), "c")  # on cpu:1
        d = bb.emit(R.tanh(c), "d")  # in place over c, on cpu:1
        return R.multiply(d, relax.const(2.0))
    compiled = tvm_ext.compile(_module(build, (64, 64)), fusion="none",
                               group2ctx={"one": "cpu:1"}, device_labels={"c": "one", "d": "one"})
    memory = compiled.report().memory
    assert set(memory.per_device) == {"cpu:0", "cpu:1"} and all(n > 0 for n in memory.per_device.values())
    assert memory.planned == sum(memory.per_device.values()) and memory.inplace >= 2
    x = np.random.default_rng(4).random((64, 64)).astype("float32")
    np.testing.assert_allclose(compiled(x), np.tanh(np.exp(-np.exp(x))) * 2, rtol=1e-5)


@pytest.mark.parametrize("group2ctx, labels, error, match", [
    ({"dev1": "cpu:1", "dev3": "cpu:1"}, {"a": "dev1"}, InputError, "group2ctx maps group 'dev3', but no node"),
    ({"dev1": "cpu:1"}, {"a": "devX"}, InputError, "node 'a' is labelled with group 'devX', which group2ctx"),
    ({"dev1": "gpu-one"}, {"a": "dev1"}, InputError, r"group2ctx\['dev1'\] = 'gpu-one' is not a device"),
    ({"dev1": {"dev": "cpu:1"}}, {"a": "dev1"}, InputError, "a dict takes the keys 'device'"),
    ({"dev1": "cpu:1"}, {"nowhere": "dev1"}, InputError, "labels name 'nowhere', which is neither a node nor an input"),
])
def test_bad_placements_name_the_group_and_the_fix(group2ctx, labels, error, match):
    def build(bb, x):
        return R.exp(bb.emit(R.exp(x), "a"))
    with pytest.raises(error, match=match):
        PlaceDevice(group2ctx, labels)(_module(build))


def test_a_device_this_tvm_cannot_build_is_a_clear_compile_error():
    # this wheel's runtime has no CUDA; with one, our CPU-only schedules say so instead
    match = "schedules CPU kernels only" if tvm.runtime.enabled("cuda") else "this TVM build lacks CUDA"
    with pytest.raises(CompileError, match=match):
        parse_device("cuda:0", "gpu_group", tvm_ext.host_target())
    with pytest.raises(CompileError, match=match):
        tvm_ext.compile(_seed_example(), shape_dict={"a": (2, 2), "b": (2, 2), "c": (2, 2)},
                        group2ctx={"dev1": "cpu:0", "dev2": "cuda:0"})
