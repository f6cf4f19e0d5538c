"""Shared helpers: build one-function Relax modules, compile them strictly, compare."""
from __future__ import annotations

import os

os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

from typing import Callable, Sequence  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_ext  # noqa: E402


def build_module(make: Callable[..., relax.Expr], specs: Sequence[tuple[tuple[int, ...], str]],
                 names: Sequence[str] | None = None) -> tvm.IRModule:
    """``main(*inputs) = make(*inputs)`` with one binding per op (the builder normalizes)."""
    names = names or [f"x{i}" for i in range(len(specs))]
    params = [relax.Var(n, relax.TensorType(s, d)) for n, (s, d) in zip(names, specs)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make(*params))
        bb.emit_func_output(out)
    return bb.get()


@tvm.instrument.pass_instrument
class PassNames:
    """A pass instrument that records the name of every pass run under it."""

    def __init__(self):
        self.names = []

    def run_before_pass(self, _mod, info):
        self.names.append(info.name)


def compile_strict(mod: tvm.IRModule, fusion="each") -> "tvm_ext.CompiledModel":
    """Compile with lowering failures raised (no silent fallback to TVM's kernels)."""
    return tvm_ext.compile(mod, fusion=fusion, strict=True)


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def another_mcpu() -> str:
    """An x86-64 CPU other than the one host targets build for (LLVM's name)."""
    from tvm_ext.machine import host_mcpu
    return "znver3" if host_mcpu() == "x86-64" else "x86-64"


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
