"""A good schedule without tuning: one ScheduleResult per kernel, chosen from shapes alone.

For every block, in order, the heuristic picks a policy by the block's kind and knobs from
its extents and the machine (vector width, core count); a multi-stage normalization kernel
gets the persistent-row form as a whole. A policy TVM rejects falls back to the next one,
down to ``ParallelOnly``, so a kernel is never left worse than unscheduled. The tuner
improves on these choices by measuring the policies' search spaces.
"""
from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from schedules.analysis import BlockInfo, Machine, block_infos
from schedules.builder import ScheduleBuilder, ScheduleResult
from schedules.policies import (Keep2D, MergeAllBlockVectorize, ParallelOnly, PersistentRows, Policy,
                                RegisterTiledAnchor, RowPerCore, SplitReduction, TransposeTile)

FAILURES = (s_tir.ScheduleError, tvm.error.InternalError, RuntimeError, ValueError, KeyError)


def policies_for(info: BlockInfo, machine: Machine) -> list[Policy]:
    """The policies to try for a block, best first by the heuristic."""
    if info.kind == "anchor":
        order = [RegisterTiledAnchor]
    elif info.kind == "row_reduce":
        order = [RowPerCore, SplitReduction] if info.size >= machine.cores else [SplitReduction, RowPerCore]
    elif info.kind == "reduce":
        order = [SplitReduction]
    elif info.kind == "transpose":
        order = [TransposeTile, Keep2D, MergeAllBlockVectorize]
    elif info.uniform and info.spatial[-1] % info.lanes(machine) and info.size % info.lanes(machine) == 0:
        # the last axis takes no full vector (3x500x700: 4 lanes of 16) but the whole block
        # does, and merged axes cost no div/mod in any load (Mish kernels: 7.7 -> 5.8 ms)
        order = [MergeAllBlockVectorize, Keep2D]
    elif len(info.spatial) >= 2 and info.spatial[-1] >= info.lanes(machine):
        order = [Keep2D, MergeAllBlockVectorize]
    else:
        order = [MergeAllBlockVectorize, Keep2D]
    return [p(machine) for p in order] + [ParallelOnly(machine)]


def default_knobs(policy: Policy, info: BlockInfo, fuse_epilogue: bool) -> dict:
    knobs = policy.default(info)
    if isinstance(policy, RegisterTiledAnchor):
        knobs["epilogue"] = fuse_epilogue
        knobs["k_unroll"] = 4
        # about 256 accumulators (16 AVX-512 registers): 8 rows of a 32-wide tile (measured best
        # at 1024: 111 GFLOP/s, against 69 for 4 rows)
        space = policy.space(info)
        want = max(1, min(8, 256 // max(1, knobs["tile_j"])))
        knobs["tile_i"] = min(space["tile_i"], key=lambda t: (abs(t - want), -t))
        # block k when a column panel of B (k x tile_j floats) no longer fits in L1: at
        # 1024^3 that took a matmul from 92 to 200 GFLOP/s, at 2048^3 from 55 to 166
        panel = info.reduce[-1] * knobs["tile_j"] * info.dtype_bits // 8
        knobs["k_block"] = 256 if 256 in space["k_block"] and panel > policy.machine.l1_bytes else 0
        # block the rows too when a core's rows of A for one k chunk outgrow an eighth of L2
        # (B's panels pass through L2 as well): at 2048^3, 122 -> 182 GFLOP/s; 1024^3, 161 -> 182
        rows_a = math.ceil(info.spatial[-2] / policy.machine.cores) * knobs["k_block"] * info.dtype_bits // 8 \
            if len(info.spatial) > 1 else 0
        knobs["i_block"] = max(space["i_block"]) if knobs["k_block"] and rows_a > policy.machine.l2_bytes // 8 else 0
    if isinstance(policy, Keep2D):
        knobs["unroll"] = False
    return knobs


def schedule_kernel(func: tirx.PrimFunc, machine: Machine = Machine(), fuse_epilogue: bool = True,
                    name: str = "kernel") -> ScheduleResult:
    """Schedule every block of ``func`` by the heuristic; returns the ScheduleResult."""
    builder = ScheduleBuilder(func)
    infos = block_infos(builder.sch)
    rows = PersistentRows(machine)
    if rows.applies(infos[-1], builder):
        trial = builder.copy()
        try:
            knobs = rows.default(infos[-1])
            rows.apply(trial, infos[-1], knobs)
            trial.choose(rows.name, knobs)
            return trial.result(name)
        except FAILURES:
            pass
    done: set[str] = set()
    for info in infos:
        if info.name in done:
            continue
        for policy in policies_for(info, machine):
            if not policy.applies(info, builder):
                continue
            applied = False
            for knobs in _fallbacks(default_knobs(policy, info, fuse_epilogue)):
                trial = builder.copy()
                try:
                    claimed = policy.apply(trial, info, knobs)
                except FAILURES:
                    continue
                builder = trial
                builder.choose(f"{policy.name}@{info.name}", knobs)
                done.update(claimed)
                applied = True
                break
            if applied:
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
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        writes_output = any(w.source.same_as(p) for w in sch.get(block).writes for p in params)
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
