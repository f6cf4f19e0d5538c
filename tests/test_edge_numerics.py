"""Numerics at the edges, against PyTorch: reductions over an empty axis."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tvm import relax

import tvm_ext
from conftest import build_module

R = relax.op


@pytest.mark.parametrize("fusion", ["autofuse", "nnvm", "none"])
@pytest.mark.parametrize("op, want", [
    ("sum", lambda x: torch.sum(x, -1)),
    ("mean", lambda x: torch.mean(x, -1)),
    ("prod", lambda x: torch.prod(x, -1)),
    ("max", lambda x: torch.full((x.shape[0],), -math.inf)),  # torch and numpy raise; ours is the identity
    ("min", lambda x: torch.full((x.shape[0],), math.inf)),
])
def test_a_reduction_over_an_empty_axis_is_its_identity(op, want, fusion):
    compiled = tvm_ext.compile(build_module(lambda x: getattr(R, op)(x, axis=[-1]), [((5, 0), "float32")], ["x"]),
                               fusion=fusion)
    x = np.empty((5, 0), np.float32)
    out = np.full(5, 123.0, np.float32)  # a kernel that never writes would leave 123 here
    compiled(x, out=out)
    np.testing.assert_array_equal(out, want(torch.from_numpy(x)).numpy())
    np.testing.assert_array_equal(compiled(x), out)


def test_an_empty_reduction_from_torch_export():
    class M(torch.nn.Module):
        def forward(self, x):
            return x.sum(-1), x.mean(-1)

    x = torch.randn(5, 0)
    s, m = tvm_ext.compile(M(), (x,))(x.numpy())
    np.testing.assert_array_equal(s, np.zeros(5, np.float32))
    assert np.isnan(m).all()
