"""A good schedule without tuning: one ScheduleResult per kernel, chosen from shapes alone.

For every block, in order, the heuristic picks a policy by the block's kind and knobs from
its extents and the machine (vector width, core count); a multi-stage normalization kernel
gets the persistent-row form as a whole. A policy TVM rejects falls back to the next one,
down to ``ParallelOnly``, so a kernel is never left worse than unscheduled. The tuner
improves on these choices by measuring the policies' search spaces.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from schedules.analysis import BlockInfo, root_blocks, stmt
from schedules.builder import ScheduleBuilder, ScheduleResult
from schedules.policies import (POLICIES, Keep2D, MergeAllBlockVectorize, ParallelOnly, Policy, ReadTile,
                                RegisterTiledAnchor, RowPerCore, SplitReduction, TransposeTile)
from tvm_ext.machine import Machine


def whole_kernel_policies(machine: Machine) -> list[Policy]:
    """The forms that take a whole kernel (``Policy.whole_kernel``), tried before the per-block ones."""
    return [p(machine) for p in POLICIES if p.whole_kernel]


def policies_for(info: BlockInfo, machine: Machine) -> list[Policy]:
    """The policies to try for a block, best first by the heuristic."""
    if info.kind == "anchor":
        order = [RegisterTiledAnchor]
    elif info.kind == "row_reduce":
        order = [RowPerCore, SplitReduction] if info.size >= machine.cores else [SplitReduction, RowPerCore]
    elif info.kind == "reduce":
        order = [SplitReduction]
    elif info.kind == "transpose":
        order = [ReadTile, TransposeTile, Keep2D, MergeAllBlockVectorize]
    elif info.uniform and info.spatial[info.inner] % info.lanes(machine) and info.size % info.lanes(machine) == 0:
        # the last axis takes no full vector (3x500x700: 4 lanes of 16) but the whole block
        # does, and merged axes cost no div/mod in any load (Mish kernels: 7.7 -> 5.8 ms)
        order = [MergeAllBlockVectorize, Keep2D]
    elif info.inner >= 1 and info.spatial[info.inner] >= info.lanes(machine):
        order = [Keep2D, MergeAllBlockVectorize]
    else:
        order = [MergeAllBlockVectorize, Keep2D]
    return [p(machine) for p in order] + [ParallelOnly(machine)]


def default_knobs(policy: Policy, info: BlockInfo, fuse_epilogue: bool) -> dict:
    """The heuristic's knobs for a block: the policy's own default (``Policy.default``)."""
    return policy.default(info, fuse_epilogue)


def schedule_kernel(func: tirx.PrimFunc, machine: Machine = Machine(), fuse_epilogue: bool = True,
                    name: str = "kernel") -> ScheduleResult:
    """Schedule every block of ``func`` by the heuristic; returns the ScheduleResult."""
    builder = ScheduleBuilder(func)
    infos = builder.infos()
    for form in whole_kernel_policies(machine):
        if form.applies(infos[-1], builder):
            tried = form.trial(builder, infos[-1], form.default(infos[-1], fuse_epilogue), label=form.name)
            if tried is not None:
                return tried[0].result(name)
    done: set[str] = set()
    for info in infos:
        if info.name in done:
            continue
        for policy in policies_for(info, machine):
            if not policy.applies(info, builder):
                continue
            tried = next(filter(None, (policy.trial(builder, info, knobs)
                                       for knobs in _fallbacks(default_knobs(policy, info, fuse_epilogue)))), None)
            if tried is not None:
                builder, claimed = tried
                done.update(claimed)
                break
    return builder.result(name)


def _fallbacks(knobs: dict):
    """The heuristic's knobs, then the same without the options TVM may reject for a given
    kernel (an epilogue that does not map onto the tile, a blocked reduction)."""
    yield knobs
    if knobs.get("epilogue"):
        knobs = dict(knobs, epilogue=False)
        yield knobs
    if knobs.get("k_block"):
        yield dict(knobs, k_block=0)


def inline_intermediates(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Inline every elementwise block whose result only feeds other blocks of ``func`` (TVM's
    FuseTIR keeps one block per fused op, each writing a full intermediate buffer).

    A block that writes an output is never compute-inlined (there is nowhere to inline it,
    and TVM aborted the process trying on ``x / 0.0``), and an inline that leaves a float
    division by a constant zero is undone: TVM's simplifier rejects it ("Divide by zero")
    though IEEE gives inf or NaN, while reading the zero from its buffer compiles."""
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    params = list(func.params)
    for block in root_blocks(sch):
        writes_output = any(w.source.same_as(p) for w in stmt(sch, block).writes for p in params)
        inlines = ("reverse_compute_inline",) if writes_output else ("compute_inline", "reverse_compute_inline")
        for inline in inlines:
            trial = sch.copy()
            try:
                getattr(trial, inline)(block)
            except (s_tir.ScheduleError, tvm.error.InternalError, RuntimeError):
                continue
            if not _divides_by_zero(trial.mod["main"]):
                sch = trial
            break
    return sch.mod["main"]


def _divides_by_zero(func: tirx.PrimFunc) -> bool:
    found = []
    tvm_ffi.structural_walk(func, (tirx.Div, lambda d: found.append(
        isinstance(d.b, tirx.FloatImm) and float(d.b.value) == 0.0)))
    return any(found)
