"""Property tests of the index-map views: random slices, transposes and reshapes composed in
one kernel must read exactly the elements numpy's views read."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

from conftest import build_module, compile_strict
from tvm_ext.lowering import broadcast_shapes

R = relax.op


@st.composite
def sliced(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(ndim))
    axis = draw(st.integers(0, ndim - 1))
    n = shape[axis]
    begin = draw(st.integers(-n - 2, n + 2))
    end = draw(st.integers(-n - 2, n + 2))
    stride = draw(st.sampled_from([1, 2, 3, -1, -2]))
    perm = draw(st.permutations(range(ndim)))
    return shape, axis, begin, end, stride, list(perm)


def _np_slice(x, axis, begin, end, stride):
    index = [slice(None)] * x.ndim
    index[axis] = slice(begin, end, stride)
    return x[tuple(index)]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(sliced())
def test_slice_then_transpose_then_flatten(params):
    shape, axis, begin, end, stride, perm = params
    x = np.arange(int(np.prod(shape)), dtype="float32").reshape(shape)
    want = _np_slice(x, axis, begin, end, stride).transpose(perm)
    if want.size == 0:
        return  # Relax rejects zero-size results before we see them
    want = want.reshape(-1)

    def make(v):
        s = R.strided_slice(v, [axis], [begin], [end], [stride])
        return R.reshape(R.permute_dims(s, perm), (want.size,))

    compiled = compile_strict(build_module(make, [(shape, "float32")]), fusion="each")
    np.testing.assert_array_equal(compiled(x), want)


@settings(max_examples=50, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.integers(1, 4), min_size=0, max_size=4), min_size=1, max_size=3))
def test_broadcast_shapes_agrees_with_numpy(shapes):
    try:
        want = np.broadcast_shapes(*map(tuple, shapes))
    except ValueError:
        with pytest.raises(ValueError):
            broadcast_shapes(*shapes)
        return
    assert broadcast_shapes(*shapes) == want
