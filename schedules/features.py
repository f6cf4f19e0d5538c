"""Features of a candidate schedule, for the tuner's cost model.

``candidate_features`` reads a ScheduleResult: its ImplGraphs (how much work runs across the
cores, in vectors, unrolled; the innermost loop's extent; how much padding uneven splits
add), the knobs the policies were given (register tile, k blocking, vector widths), and the
kernel's size (bytes moved, arithmetic work and intensity). What depends on the machine is
expressed relative to it: vector width over the machine's lanes, parallel chunks per core,
footprints over the register file and the L1, L2 and L3 the OS reports, so that one model
ranks candidates of kernels of several sizes, and on machines of several shapes.

``per_store_features`` adds TVM's own MetaSchedule ``PerStoreFeature`` (164 numbers per
store statement, summed and maxed over the kernel's stores); the tuner uses it only when
asked, since whether it helps is measured, not assumed (see the tuning tutorial).
"""
from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import s_tir

from schedules.analysis import arithmetic_ops, block_infos, root_blocks, stmt
from schedules.builder import ScheduleResult
from schedules.policies import POLICIES
from tvm_ext.machine import Machine

_POLICY_NAMES = [p.name for p in POLICIES]
_KNOBS = list(dict.fromkeys(k for p in reversed(POLICIES) for k in p.KNOBS))  # as the policies declare them,
# the simplest policy first: vector, unroll, tile, chunks, tile_i ... (the order records' features were written in)
_KINDS = ("anchor", "row_reduce", "elementwise")  # what a block is, for the per-kind choices
_SLOTS = 4  # the first blocks of a kernel, each described on its own
PER_STORE_LENGTH = 2 * 164  # PerStoreFeature's 164 numbers per store, summed and maxed

NAMES = (["log_bytes", "log_work", "blocks", "anchor_share", "dtype_bytes",
          "groups", "loops", "log_parallel", "parallel_share", "log_work_per_core", "balance",
          "vector_share", "log_vector", "vector_fill", "log_unroll", "log_inner", "inner_reduce_share",
          "reg_tile_bytes", "reg_fill", "panel_l1", "rows_l1", "chunk_l2",
          "log_intensity", "vector_over_lanes", "split_waste", "even_splits", "chunks_per_core",
          "chunk_l1", "bytes_l3", "a_block_l2"]
         + [f"{kind}_{what}" for kind in _KINDS for what in [f"policy_{p}" for p in _POLICY_NAMES]
            + ["log_vector", "min_vector", "unroll"]]
         + [f"block{i}_{what}" for i in range(_SLOTS) for what in [f"policy_{p}" for p in _POLICY_NAMES]
            + [f"kind_{k}" for k in _KINDS] + ["log_vector", "unroll", "uniform", "share"]]
         + [f"policy_{p}" for p in _POLICY_NAMES] + [f"knob_{k}" for k in _KNOBS])


def candidate_features(result: ScheduleResult, machine: Machine) -> np.ndarray:
    """One fixed-length vector (``NAMES``) describing a scheduled kernel."""
    sch = s_tir.Schedule(tvm.IRModule({"main": result.func}))
    infos = block_infos(sch)
    work = {i.name: math.prod(i.spatial) * max(1, math.prod(i.reduce)) for i in infos}
    total_work = max(1, sum(work.values()))
    nbytes = _buffer_bytes(sch)
    dtype_bytes = max(1, max((i.dtype_bits for i in infos), default=32) // 8)
    anchor_work = sum(work[i.name] for i in infos if i.kind == "anchor")
    blocks = (stmt(sch, rv) for rv in root_blocks(sch))
    ops = {b.name_hint: arithmetic_ops(b.body) for b in blocks}

    par_axes = {id(g.impl[g.impl.parallel]) for g in result.groups if g.impl.parallel}
    par_extent = max([g.impl[g.impl.parallel].size for g in result.groups if g.impl.parallel] or [1])
    f = dict(log_bytes=math.log2(1 + nbytes), log_work=math.log2(total_work), blocks=len(infos),
             anchor_share=anchor_work / total_work, dtype_bytes=dtype_bytes, groups=len(result.groups),
             loops=sum(len(g.impl.axis) for g in result.groups), log_parallel=math.log2(par_extent))
    par_share = vec_share = log_vec = vec_fill = log_unroll = log_inner = inner_reduce = 0.0
    vec_lanes = waste = 0.0
    lanes = machine.vector_bytes // dtype_bytes
    for g in result.groups:
        w = work.get(g.block, 0) / total_work
        axes = g.impl.axis
        if any(id(a) in par_axes for a in axes):
            par_share += w
        vec = [s.axes[0] for s in g.impl.steps if s.op == "vectorize" and s.axes[0] in g.impl.names]
        if vec:
            size = g.impl[vec[-1]].size
            vec_share += w
            log_vec += w * math.log2(size)
            vec_fill += w * min(1.0, size / lanes)
            vec_lanes += w * math.log2(size / lanes)
        for step in g.impl.steps:
            if step.op in ("block_split", "tile_split") and len(step.args) > 3:
                inner, size = step.args[0], step.args[3]
                waste += w * (math.ceil(size / inner) * inner / size - 1)
        log_unroll += w * math.log2(math.prod(g.impl[n].size for n in g.impl.unrolled if n in g.impl.names) or 1)
        loops = [a for a in axes if a.name not in vec and a.name not in g.impl.unrolled]
        if loops:
            log_inner += w * math.log2(max(1, loops[-1].size))
            inner_reduce += w * loops[-1].reduce
    f.update(parallel_share=par_share, vector_share=vec_share, log_vector=log_vec, vector_fill=vec_fill,
             log_unroll=log_unroll, log_inner=log_inner, inner_reduce_share=inner_reduce)
    cores_used = min(par_extent, machine.cores)
    f["log_work_per_core"] = math.log2(1 + total_work / cores_used)
    f["balance"] = (par_extent / (math.ceil(par_extent / machine.cores) * machine.cores)) if par_extent > 1 else 0.0

    knobs: dict[str, float] = {}
    policy_share = dict.fromkeys(_POLICY_NAMES, 0.0)
    for label, ks in result.choices:
        policy, _, block = label.partition("@")
        policy_share[policy] = policy_share.get(policy, 0.0) + (work.get(block, total_work) / total_work)
        for k, v in ks.items():
            knobs[k] = max(knobs.get(k, 0.0), float(v))
    f.update({f"policy_{p}": policy_share[p] for p in _POLICY_NAMES})
    f.update({f"knob_{k}": math.log2(1 + knobs.get(k, 0.0)) for k in _KNOBS})

    anchor = next((i for i in infos if i.kind == "anchor"), None)
    tile_i, tile_j = knobs.get("tile_i", 1.0), knobs.get("tile_j", 0.0)
    k = (knobs.get("k_block") or (anchor.reduce[-1] if anchor else 0)) if anchor else 0
    reg = tile_i * tile_j * dtype_bytes
    f["reg_tile_bytes"] = math.log2(1 + reg)
    f["reg_fill"] = reg / (machine.vector_registers * machine.vector_bytes)  # over the register file
    f["panel_l1"] = k * tile_j * dtype_bytes / machine.l1_bytes
    f["rows_l1"] = k * tile_i * dtype_bytes / machine.l1_bytes
    f["chunk_l2"] = nbytes / cores_used / machine.l2_bytes
    f["log_intensity"] = math.log2(1 + sum(work[n] * ops.get(n, 1) for n in work) / max(1, nbytes))
    f["vector_over_lanes"], f["split_waste"], f["even_splits"] = vec_lanes, waste, float(waste == 0)
    f["chunks_per_core"] = math.log2(max(1, par_extent) / machine.cores)
    f["chunk_l1"] = math.log2(1 + nbytes / max(1, par_extent) / machine.l1_bytes)
    f["bytes_l3"] = math.log2(1 + nbytes / machine.l3_bytes)
    f["a_block_l2"] = knobs.get("i_block", 0.0) * k * dtype_bytes / machine.l2_bytes
    f.update(_choices_by_kind(result, infos, work))
    f.update(_choices_by_block(result, infos, work, total_work))
    return np.array([f[n] for n in NAMES], dtype="float32")


def _choices_by_block(result: ScheduleResult, infos, work: dict[str, int], total_work: int) -> dict[str, float]:
    """Each of the kernel's first blocks, in program order: its kind, whether its reads are all
    at its own index, its share of the work, and the policy, vector width and unrolling it got.
    Two kernels of a class have their blocks in the same order (softmax: max, exp, sum, divide),
    and which block got which choice matters: a broadcast read merged into one axis costs a
    division per element, the same choice on the block beside it costs nothing."""
    f = {}
    chosen: dict[str, tuple[str, dict]] = {}
    for label, knobs in result.choices:
        policy, _, block = label.partition("@")
        for b in ([block] if block else [i.name for i in infos]):
            chosen[b] = (policy, knobs)
    for i in range(_SLOTS):
        info = infos[i] if i < len(infos) else None
        policy, knobs = chosen.get(info.name, ("", {})) if info is not None else ("", {})
        for p in _POLICY_NAMES:
            f[f"block{i}_policy_{p}"] = float(policy == p)
        for k in _KINDS:
            f[f"block{i}_kind_{k}"] = float(info is not None and _kind(info.kind) == k)
        f[f"block{i}_log_vector"] = math.log2(1 + (knobs.get("vector", knobs.get("tile_j", 0)) or 0))
        f[f"block{i}_unroll"] = float(bool(knobs.get("unroll", False)))
        f[f"block{i}_uniform"] = float(info is not None and info.uniform)
        f[f"block{i}_share"] = work.get(info.name, 0) / total_work if info is not None else 0.0
    return f


def _kind(block_kind: str) -> str:
    return {"anchor": "anchor", "row_reduce": "row_reduce", "reduce": "row_reduce"}.get(block_kind, "elementwise")


def _choices_by_kind(result: ScheduleResult, infos, work: dict[str, int]) -> dict[str, float]:
    """Which policy, vector width and unrolling each kind of block got, weighted by the blocks'
    work within the kind: the knobs of a kernel's reductions and of its elementwise stages
    apart (a maximum over all blocks hides the narrowest), comparable across kernels of a class."""
    kind_of = {i.name: _kind(i.kind) for i in infos}
    total = {k: sum(w for b, w in work.items() if kind_of[b] == k) for k in _KINDS}
    f = {f"{k}_{w}": 0.0 for k in _KINDS for w in [f"policy_{p}" for p in _POLICY_NAMES] + ["log_vector", "unroll"]}
    narrowest: dict[str, float] = {}
    for label, knobs in result.choices:
        policy, _, block = label.partition("@")
        blocks = [block] if block in kind_of else list(kind_of)  # a whole-kernel policy covers every block
        vector = knobs.get("vector", knobs.get("tile_j", 0)) or 0
        for b in blocks:
            k = kind_of[b]
            share = work[b] / max(1, total[k])
            f[f"{k}_policy_{policy}"] += share
            f[f"{k}_log_vector"] += share * math.log2(1 + vector)
            f[f"{k}_unroll"] += share * float(bool(knobs.get("unroll", False)))
            narrowest[k] = min(narrowest.get(k, math.inf), math.log2(1 + vector))
    f.update({f"{k}_min_vector": narrowest.get(k, 0.0) for k in _KINDS})
    return f


def per_store_features(result: ScheduleResult, target: tvm.target.Target) -> np.ndarray:
    """TVM MetaSchedule's PerStoreFeature of the scheduled kernel, summed and maxed over stores."""
    from tvm.s_tir import meta_schedule as ms

    ctx = ms.TuneContext(mod=tvm.IRModule({"main": result.func}), target=target)
    cand = ms.MeasureCandidate(s_tir.Schedule(tvm.IRModule({"main": result.func})), [])
    per_store = ms.feature_extractor.PerStoreFeature().extract_from(ctx, [cand])[0].numpy()
    if per_store.size == 0:
        return np.zeros(PER_STORE_LENGTH, dtype="float32")
    return np.concatenate([per_store.sum(axis=0), per_store.max(axis=0)]).astype("float32")


def _buffer_bytes(sch: s_tir.Schedule) -> int:
    """Bytes of the distinct buffers the kernel's blocks read and write."""
    seen = {}
    for rv in root_blocks(sch):
        block = stmt(sch, rv)
        for region in list(block.reads) + list(block.writes):
            buf = region.source
            seen[buf.name] = math.prod(int(d) for d in buf.shape) * tvm.DataType(str(buf.dtype)).bits // 8
    return sum(seen.values())
