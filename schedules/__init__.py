"""Schedules: how each generated kernel's loops run (the graph is never touched here)."""
from __future__ import annotations

import tvm
from tvm import tirx

from schedules.default import ScheduleConfig, block_kind, inline_intermediates, schedule_prim_func
from tvm_ext import attrs
from tvm_ext.patterns import OpPattern
from tvm_ext.registry import OPS


@tvm.ir.transform.module_pass(opt_level=0, name="ScheduleKernels")
class ScheduleKernels:
    """Give every PrimFunc that FuseCompile generated its default schedule.

    ``all_kernels=True`` schedules TVM's own (legalized or FuseTIR-fused) kernels too, after
    inlining their elementwise intermediate blocks: the "tvm" fusion strategy.
    """

    def __init__(self, config: ScheduleConfig | None = None, all_kernels: bool = False):
        self.config = config
        self.all_kernels = all_kernels

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        config = self.config or ScheduleConfig()
        out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            ours = func.attrs is not None and attrs.KERNEL in func.attrs
            if ours or self.all_kernels:
                if not ours:
                    func = inline_intermediates(func)
                scheduled, plans = schedule_prim_func(func, config, _master_is_anchor(func))
                plan_text = ", ".join(f"{b}:{p}" for b, p in plans.items())
                out[gv] = scheduled.with_attr(attrs.SCHEDULE, plan_text)
        return out


def _master_is_anchor(func: tirx.PrimFunc) -> bool:
    """Whether the group was built around an anchor (its epilogue then runs on the anchor's
    tiles); a master re-pointed to an elementwise node keeps the stages apart."""
    master = str(func.attrs.get(attrs.MASTER, "")) if func.attrs is not None else ""
    opdef = OPS.get("relax." + master.partition(":")[2]) if master else None
    return opdef is None or opdef.pattern == OpPattern.OUT_EWISE_FUSABLE


__all__ = ["ScheduleConfig", "ScheduleKernels", "block_kind", "schedule_prim_func"]
