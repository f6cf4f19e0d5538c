"""Schedules: how each generated kernel's loops run (the graph is never touched here).

``axes`` holds the ImplGraph axis model, ``builder`` the ScheduleResult / ScheduleGroup and
the builder policies use, ``policies`` the schedule policies with their knobs, and
``heuristic`` the untuned choice of one ScheduleResult per kernel. The tuner chooses among
the policies' results by measuring: ``tasks``, ``search_space``, ``features``,
``cost_model``, ``tuner``, ``measure`` / ``workers``, ``database``, and ``history`` (the
best records, which ``ScheduleKernels`` applies in place of the heuristic's choice).
"""
from __future__ import annotations

import dataclasses
import warnings

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from schedules.analysis import block_infos, master_is_anchor
from schedules.axes import AxisRuleError, AxisType, ImplGraph
from schedules.builder import ScheduleBuilder, ScheduleGroup, ScheduleResult
from schedules.heuristic import inline_intermediates, schedule_kernel
from schedules.measure import arg_specs
from schedules.policies import POLICIES
from schedules.search_space import CandidateError, apply_candidate
from tvm_ext import attrs
from tvm_ext.machine import Machine


@tvm.ir.transform.module_pass(opt_level=0, name="ScheduleKernels")
class ScheduleKernels:
    """Give every PrimFunc that FuseCompile generated the heuristic's ScheduleResult.

    ``all_kernels=True`` schedules TVM's own (legalized or FuseTIR-fused) kernels too, after
    inlining their elementwise intermediate blocks: those of the "tvm" fusion strategy, and
    under ours those of the ops we do not lower.
    """

    def __init__(self, machine: Machine | None = None, all_kernels: bool = False, history=None):
        self.machine = machine
        self.all_kernels = all_kernels
        self.history = history  # an ApplyHistoryBest: tuned schedules take precedence
        # (kernel, why its tuning record did not apply, or why TVM's kernel keeps its loops)
        self.fallbacks: list[tuple[str, str]] = []

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        machine = self.machine or Machine()
        out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            ours = func.attrs is not None and attrs.KERNEL in func.attrs
            if not ours and not _static(func):
                continue  # a TVM kernel over symbolic dims: our policies need static extents
            if not ours and self.all_kernels:
                why = _unschedulable(func)
                if why is None:
                    try:
                        out[gv] = self._schedule(gv, inline_intermediates(func), machine)
                        continue
                    except Exception as err:  # noqa: BLE001 - TVM's kernel as it was is a sound result
                        why = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200]}"
                self.fallbacks.append((gv.name_hint, f"TVM's kernel left unscheduled: {why}"))
            elif ours:
                out[gv] = self._schedule(gv, func, machine)
        return out

    def _schedule(self, gv: tvm.ir.GlobalVar, func: tirx.PrimFunc, machine: Machine) -> tirx.PrimFunc:
        """``func`` with the heuristic's schedule, or its tuned one when the history has it."""
        here = machine
        own_target = func.attrs.get("target") if func.attrs is not None else None
        if own_target is not None:  # a kernel placed on another device (PlaceDevice)
            here = Machine.for_target(own_target)
        cores = int(func.attrs[attrs.CORES]) if func.attrs is not None and attrs.CORES in func.attrs else None
        if cores is not None and cores < here.cores:  # a core scope (AutoFuse rule 8)
            here = dataclasses.replace(here, cores=cores)
        untuned = schedule_kernel(func, here, master_is_anchor(func), gv.name_hint)
        # tuning records are of the pipeline's target and all its cores: they apply to kernels built so
        tuned = self._tuned(func, here, gv.name_hint, untuned) if here == machine else None
        result = tuned or untuned
        summary = result.summary() + (" [tuned]" if tuned is not None else "")
        return result.func.with_attr(attrs.SCHEDULE, summary)

    def _tuned(self, func: tirx.PrimFunc, machine: Machine, name: str,
               untuned: ScheduleResult) -> ScheduleResult | None:
        """The best record's schedule, if it beats the heuristic's (``ApplyHistoryBest.lookup``)."""
        heuristic = [[label, dict(knobs)] for label, knobs in untuned.choices]
        candidate = self.history.lookup(func, heuristic) if self.history is not None else None
        if candidate is None:
            return None
        try:
            return apply_candidate(func, machine, candidate, name)
        except CandidateError as err:  # a record from another version of the policies
            self.fallbacks.append((name, str(err)))
            warnings.warn(f"the tuning record of kernel {name} does not apply ({err}); it keeps the heuristic's "
                          "schedule (tune it again to replace the record)", stacklevel=2)
            return None


#: the calls a TVM kernel may hold for our vectorizing schedules: LLVM has a vector form of
#: each (TVM's ``tirx.sinh`` has none, and a vectorized kernel holding it failed to build)
_VECTOR_CALLS = frozenset(["tirx.if_then_else", "tirx.likely", "tirx.reinterpret", "tirx.floor", "tirx.ceil",
                           "tirx.round", "tirx.nearbyint", "tirx.trunc", "tirx.fabs", "tirx.sqrt", "tirx.fma",
                           "tirx.shift_left", "tirx.shift_right", "tirx.bitwise_and", "tirx.bitwise_or",
                           "tirx.bitwise_xor", "tirx.bitwise_not", "tirx.isnan", "tirx.isinf"])


def _unschedulable(func: tirx.PrimFunc) -> str | None:
    """Why our schedules must leave TVM's kernel ``func`` as it is, or None: a call without a
    vector form, or no root block (a kernel written as plain loops, TVM's scatter of ``take``'s
    gradient)."""
    if not isinstance(func.body, s_tir.SBlockRealize) or func.body.block.name_hint != "root":
        return "no root block"
    calls = set()

    def visit(node):
        if isinstance(node, tvm.ir.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name.startswith("tirx."):
            calls.add(node.op.name)
    tvm_ffi.structural_walk(func.body, visit, order="pre")
    other = sorted(calls - _VECTOR_CALLS)
    return f"it calls {', '.join(other)}" if other else None


def _static(func: tirx.PrimFunc) -> bool:
    """Whether every parameter is a buffer of constant shape (what ``arg_specs`` requires)."""
    try:
        arg_specs(func)
    except (TypeError, ValueError):
        return False
    return True


__all__ = ["AxisRuleError", "AxisType", "ImplGraph", "Machine", "POLICIES", "ScheduleBuilder", "ScheduleGroup",
           "ScheduleKernels", "ScheduleResult", "block_infos", "master_is_anchor", "schedule_kernel"]
