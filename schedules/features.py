"""Features of a candidate schedule, for the tuner's cost model.

``candidate_features`` reads a ScheduleResult: its ImplGraphs (how much work runs across the
cores, in vectors, unrolled; the innermost loop's extent), the knobs the policies were
given (register tile, k blocking, vector widths), the footprints those imply against the
machine's register file and L1, and the kernel's size (bytes moved, arithmetic work), so
one model can rank candidates of several kernels (transfer between tasks).

``per_store_features`` adds TVM's own MetaSchedule ``PerStoreFeature`` (164 numbers per
store statement, summed and maxed over the kernel's stores); the tuner uses it only when
asked, since whether it helps is measured, not assumed (see the tuning tutorial).
"""
from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import s_tir

from schedules.analysis import Machine, block_infos
from schedules.builder import ScheduleResult
from schedules.policies import POLICIES

_POLICY_NAMES = [p.name for p in POLICIES]
_KNOBS = ["vector", "unroll", "tile", "chunks", "tile_i", "tile_j", "k_unroll", "epilogue", "k_block", "i_block",
          "prefetch", "accumulators"]
_REGISTER_FILE = 32 * 64  # bytes: 32 AVX-512 registers
PER_STORE_LENGTH = 2 * 164  # PerStoreFeature's 164 numbers per store, summed and maxed

NAMES = (["log_bytes", "log_work", "blocks", "anchor_share", "dtype_bytes",
          "groups", "loops", "log_parallel", "parallel_share", "log_work_per_core", "balance",
          "vector_share", "log_vector", "vector_fill", "log_unroll", "log_inner", "inner_reduce_share",
          "reg_tile_bytes", "reg_fill", "panel_l1", "rows_l1", "chunk_l2"]
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

    par_axes = {id(g.impl[g.impl.parallel]) for g in result.groups if g.impl.parallel}
    par_extent = max([g.impl[g.impl.parallel].size for g in result.groups if g.impl.parallel] or [1])
    f = dict(log_bytes=math.log2(1 + nbytes), log_work=math.log2(total_work), blocks=len(infos),
             anchor_share=anchor_work / total_work, dtype_bytes=dtype_bytes, groups=len(result.groups),
             loops=sum(len(g.impl.axis) for g in result.groups), log_parallel=math.log2(par_extent))
    par_share = vec_share = log_vec = vec_fill = log_unroll = log_inner = inner_reduce = 0.0
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
    f["reg_fill"] = reg / _REGISTER_FILE
    f["panel_l1"] = k * tile_j * dtype_bytes / machine.l1_bytes
    f["rows_l1"] = k * tile_i * dtype_bytes / machine.l1_bytes
    f["chunk_l2"] = nbytes / cores_used / (1 << 20)
    return np.array([f[n] for n in NAMES], dtype="float32")


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
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        for region in list(block.reads) + list(block.writes):
            buf = region.source
            seen[buf.name] = math.prod(int(d) for d in buf.shape) * tvm.DataType(str(buf.dtype)).bits // 8
    return sum(seen.values())
