"""PackMatmulWeights: a constant right operand of a matmul is stored in column panels.

``matmul(x, W)`` with ``W`` a constant ``(k, n)`` matrix reads, for each register tile of
the output, a ``k x panel`` strip of ``W`` whose rows lie ``n`` floats apart: one cache line
and often one page per row of the strip. Stored as ``Wp[n / panel, k, panel]`` the strip is
contiguous. The pass makes that copy at compile time (as ONNX Runtime and oneDNN pre-pack
their weights) and puts ``reshape(permute_dims(Wp))`` in place of ``W``: the graph keeps its
meaning, and fusion composes the two views into the matmul's loads, so the kernel reads
``Wp[j // panel, k, j % panel]`` (``schedules.analysis`` sees a tile-contiguous operand and
keeps the register tile inside one panel).

It runs after FoldWeightLayout, which would fold the views back into a constant.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from relay_passes.simplify import bound_constant, constant_data, new_constant_data, rewrite_functions


@tvm.ir.transform.module_pass(opt_level=0, name="PackMatmulWeights")
class PackMatmulWeights:
    """Store the constant right operands of float32 matmuls in ``panel``-wide column panels."""

    def __init__(self, panel: int = 32, min_elements: int = 1 << 14):
        self.panel = panel
        self.min_elements = min_elements  # smaller weights stay in cache anyway

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return rewrite_functions(mod, _Packer(mod, self.panel, self.min_elements))


@mutator
class _Packer(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, panel: int, min_elements: int):
        super().__init__(mod)
        self.panel, self.min_elements = panel, min_elements
        self.packed: list[tuple[relax.Expr, relax.Expr]] = []  # (constant, its packed view): one each

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.matmul" and len(call.args) == 2):
            return call
        w = bound_constant(self, call.args[1])
        if w is None:
            return call
        data = constant_data(w)
        if data.dtype != np.float32 or data.ndim != 2 or data.size < self.min_elements:
            return call
        k, n = data.shape
        if n % self.panel or n == self.panel:
            return call
        weight = next((view for const, view in self.packed if const.same_as(w)), None)
        if weight is None:
            packed = new_constant_data(data.reshape(k, n // self.panel, self.panel).transpose(1, 0, 2))
            panels = self.builder_.emit(relax.op.permute_dims(relax.const(packed), [1, 0, 2]), "weight_panels")
            weight = self.builder_.emit(relax.op.reshape(panels, (k, n)), "weight")
            self.packed.append((w, weight))
        return relax.op.matmul(call.args[0], weight, out_dtype=call.attrs.out_dtype)
