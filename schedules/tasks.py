"""Tuning tasks: a compiled model's kernels, one task per distinct kernel and target.

Two kernels that differ only in their name (the same fused ops on the same shapes, in one
model or in two) are one task, keyed by the structural hash of the unscheduled PrimFunc
without its attributes, plus the target. The tuning database is indexed by that key.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from schedules.analysis import block_infos, master_is_anchor
from tvm_ext.machine import Machine
from tvm_ext import attrs


@dataclass
class Task:
    """One kernel to tune."""

    key: str  # structural hash of the kernel, hex
    name: str  # the kernel's name where it first occurs
    func: tirx.PrimFunc  # unscheduled
    target: str
    weight: int = 1  # how many calls of the model run it
    fuse_epilogue: bool = True  # what the heuristic does with an anchor's epilogue

    @functools.cached_property
    def kernel_class(self) -> str:
        return kernel_class(self.func)

    @functools.cached_property
    def machine(self) -> Machine:
        """The target as schedules see it (read once: every candidate applied asks for it)."""
        return Machine.for_target(tvm.target.Target(self.target))


def kernel_key(func: tirx.PrimFunc) -> str:
    """Structural hash of a kernel's parameters and body (its name and attributes left out)."""
    bare = tirx.PrimFunc(func.params, func.body, func.ret_type)
    return f"{tvm_ffi.structural_hash(bare) & (2 ** 64 - 1):016x}"


def kernel_class(func: tirx.PrimFunc) -> str:
    """The kinds of a kernel's blocks, e.g. "pointwise+row_reduce": kernels of one class are
    scheduled by the same policies, so their measurements say most about each other."""
    return "+".join(sorted({i.kind for i in block_infos(s_tir.Schedule(tvm.IRModule({"main": func})))}))


def target_key(target: tvm.target.Target | str) -> str:
    return str(target if isinstance(target, tvm.target.Target) else tvm.target.Target(target))


def extract_tasks(lowered: tvm.IRModule, target: tvm.target.Target, all_kernels: bool = False) -> list[Task]:
    """The tasks of an unscheduled lowered module (``Pipeline(schedule=False).lower``): our
    kernels (every PrimFunc with ``all_kernels``), de-duplicated, weighted by call count."""
    calls = _call_counts(lowered)
    tasks: dict[str, Task] = {}
    for gv, func in lowered.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        if not (all_kernels or (func.attrs is not None and attrs.KERNEL in func.attrs)):
            continue
        key = kernel_key(func)
        if key in tasks:
            tasks[key].weight += calls.get(gv.name_hint, 1)
        else:
            tasks[key] = Task(key, gv.name_hint, func, target_key(target), calls.get(gv.name_hint, 1),
                              master_is_anchor(func))
    return list(tasks.values())


def _call_counts(mod: tvm.IRModule) -> dict[str, int]:
    counts: dict[str, int] = {}

    def visit(expr):
        if isinstance(expr, tvm.relax.Call) and expr.op == tvm.ir.Op.get("relax.call_tir"):
            name = expr.args[0].name_hint
            counts[name] = counts.get(name, 0) + 1

    for func in mod.functions.values():
        if isinstance(func, tvm.relax.Function):
            tvm.relax.analysis.post_order_visit(func, visit)
    return counts
