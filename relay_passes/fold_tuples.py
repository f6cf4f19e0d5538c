"""FoldTupleGetItem: ``t = (a, b); x = t[0]`` becomes ``x = a``.

Importers pack values into tuples and unpack them again (PyTorch's ``max(dim)`` gives
``(values, indices)``); left in place, the tuple hides the value's producer from fusion.
Relax's CanonicalizeBindings does not fold this, so this small pass does; dead-code
elimination then drops the tuple.
"""
from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator


@tvm.ir.transform.module_pass(opt_level=0, name="FoldTupleGetItem")
class FoldTupleGetItem:
    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        folder = _Folder(mod)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                folder.builder_.update_func(gv, folder.visit_expr(func))
        return folder.builder_.get()


@mutator
class _Folder(PyExprMutator):
    def visit_tuple_getitem_(self, op: relax.TupleGetItem) -> relax.Expr:
        op = self.visit_expr_post_order(op)
        tup = op.tuple_value
        if isinstance(tup, relax.Var):
            bound = self.lookup_binding(tup)
            if isinstance(bound, relax.Tuple):
                return bound.fields[op.index]
        return op
