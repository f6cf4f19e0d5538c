"""Bad input gets an error that names the node or input and says what to do."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from tvm import relax

import tvm_ext
from conftest import build_module
from tvm_ext import OPS

R = relax.op


def test_op_without_any_lowering_is_named():
    mod = build_module(lambda a, b: R.nn.relu(R.ewise_fma(a, b, b)), [((4,), "float32")] * 2)
    with pytest.raises(tvm_ext.UnsupportedOpError) as info:
        tvm_ext.compile(mod, registry=OPS.without("relax.ewise_fma"))
    msg = str(info.value)
    assert "relax.ewise_fma" in msg and "node 'lv'" in msg and "register_op" in msg
    assert "Traceback" not in msg


def test_the_same_op_compiles_with_our_lowering():
    mod = build_module(lambda a, b: R.ewise_fma(a, b, b), [((4,), "float32")] * 2)
    a, b = np.arange(4, dtype="float32"), np.full(4, 2, "float32")
    np.testing.assert_allclose(tvm_ext.compile(mod)(a, b), a * b + b)


def test_unsupported_dtype_is_named():
    mod = build_module(lambda a: R.add(a, a), [((4,), "float8_e4m3fn")], names=["activations"])
    with pytest.raises(tvm_ext.UnsupportedDtypeError, match="input 'activations'.*float8_e4m3fn.*astype"):
        tvm_ext.compile(mod)


@pytest.mark.parametrize("mode,widths", [("reflect", [0, 0, 0, 4]), ("circular", [0, 0, 5, 0])])
def test_a_pad_wider_than_its_mode_allows_names_the_node_and_the_limit(mode, widths):
    mod = build_module(lambda a: R.nn.pad(a, widths, mode), [((2, 4), "float32")])
    limit = 3 if mode == "reflect" else 4
    with pytest.raises(tvm_ext.ShapeError, match=f"gv: {mode} padding of {max(widths)} on axis 1 of size 4: "
                                                 f"it must be at most {limit}"):
        tvm_ext.compile(mod)


def test_shape_mismatch_in_a_torch_model_names_the_shapes():
    model = nn.Sequential(nn.Linear(64, 8))
    with pytest.raises(tvm_ext.FrontendError, match=r"Sequential.*\(4, 32\).*shapes"):
        tvm_ext.compile(model, (torch.randn(4, 32),))


def test_torch_module_needs_example_inputs():
    with pytest.raises(tvm_ext.FrontendError, match="example_inputs"):
        tvm_ext.compile(nn.ReLU())


def test_unknown_model_kind():
    with pytest.raises(tvm_ext.FrontendError, match="cannot compile a builtins.dict"):
        tvm_ext.compile({"not": "a model"})


def test_unknown_fusion_choice():
    mod = build_module(R.exp, [((4,), "float32")])
    with pytest.raises(ValueError, match="unknown fusion 'fastest'"):
        tvm_ext.compile(mod, fusion="fastest")


@pytest.fixture(scope="module")
def compiled():
    return tvm_ext.compile(build_module(R.add, [((2, 3), "float32"), ((3,), "float32")], names=["x", "bias"]))


def test_call_with_wrong_shape_names_the_input(compiled):
    with pytest.raises(tvm_ext.InputError, match=r"input 'bias' \(argument 1\) must have shape \[3\], got \[4\]"):
        compiled(np.zeros((2, 3), "float32"), np.zeros(4, "float32"))


def test_call_with_wrong_dtype_names_the_input(compiled):
    with pytest.raises(tvm_ext.InputError, match=r"input 'x' \(argument 0\) must be float32, got float64"):
        compiled(np.zeros((2, 3)), np.zeros(3, "float32"))


def test_call_with_wrong_count_lists_the_signature(compiled):
    with pytest.raises(tvm_ext.InputError, match=r"expected 2 inputs \(x: \[2, 3\] float32, bias: \[3\] float32\)"):
        compiled(np.zeros((2, 3), "float32"))


def test_input_error_is_a_value_error(compiled):
    with pytest.raises(ValueError):
        compiled(np.zeros((2, 2), "float32"), np.zeros(3, "float32"))
