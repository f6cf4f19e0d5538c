"""The default schedule of a generated kernel, chosen from its TIR alone (no tuning).

Every block of the PrimFunc gets one of three plans, picked from its iteration types and
the index of its reads:

- pointwise: fuse the outer loops and run them in parallel, vectorize the innermost axis;
- row reduction (the reduce axis is the contiguous one): ``rfactor`` a vector-wide split
  of it so partial sums live in one vector register per row, rows in parallel;
- anchor (the innermost spatial axis is contiguous in some read: matmul's B[k, j],
  conv2d's x[.., ow + kw], a column sum): an i x j register tile accumulated in a
  ``cache_write`` buffer with the reduce loops outside the vectorized j.

Each plan is tried on a copy of the schedule and dropped if TVM rejects it, so a kernel is
never left worse than unscheduled. The ImplGraph policies of ``schedules/`` replace this.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx


SPATIAL, REDUCE = 0, 2


@dataclass(frozen=True)
class ScheduleConfig:
    cores: int = len(os.sched_getaffinity(0))
    vector_bytes: int = 64  # AVX-512
    parallel_min_elems: int = 4096  # below this a parallel launch costs more than it saves

    @classmethod
    def for_target(cls, target: tvm.target.Target) -> "ScheduleConfig":
        cores = int(target.attrs.get("num-cores", 0) or len(os.sched_getaffinity(0)))
        return cls(cores=cores, vector_bytes=64 if _has_avx512(target) else 32)


def _has_avx512(target: tvm.target.Target) -> bool:
    mcpu = str(target.attrs.get("mcpu", ""))
    mattr = " ".join(str(a) for a in target.attrs.get("mattr", []) or [])
    if "avx512" in mattr:
        return True
    return mcpu in ("skylake-avx512", "cascadelake", "cooperlake", "icelake-server", "icelake-client",
                    "tigerlake", "sapphirerapids", "emeraldrapids", "graniterapids", "znver4", "znver5")


def schedule_prim_func(func: tirx.PrimFunc, config: ScheduleConfig = ScheduleConfig(),
                       fuse_epilogue: bool = True) -> tuple[tirx.PrimFunc, dict[str, str]]:
    """Apply a plan to every block of ``func``; returns the scheduled PrimFunc and the plan
    each block got ("none" when TVM rejected every plan).

    ``fuse_epilogue``: an anchor's elementwise consumer is computed on the anchor's output
    tile (set when the group's master is the anchor).
    """
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    trial = sch.copy()
    try:
        if persistent_rows(trial, names, config):
            return trial.mod["main"], {name: "persistent_rows" for name in names}
    except (s_tir.ScheduleError, tvm.error.InternalError, RuntimeError, ValueError):
        pass
    applied: dict[str, str] = {}
    for name in names:
        if name in applied:  # already placed inside another block's loops
            continue
        applied[name] = "none"
        for plan in _plans(sch, name, fuse_epilogue):
            trial = sch.copy()
            try:
                placed = plan(trial, trial.get_sblock(name), config) or ()
            except (s_tir.ScheduleError, tvm.error.InternalError, RuntimeError, ValueError):
                continue
            sch = trial
            applied[name] = plan.__name__.strip("_")
            for other in placed:
                applied[other] = f"epilogue of {name}"
            break
    return sch.mod["main"], applied


def persistent_rows(sch: s_tir.Schedule, names: list[str], config: ScheduleConfig) -> bool:
    """The multi-stage form of a normalization kernel (softmax, layer norm, ...): all stages
    of one row run together, so the row is read from memory once and stays in cache.

    Applies to a kernel whose last block is its only output and whose reductions reduce
    trailing axes of rows that every block shares. Each row reduction keeps a vector of
    partial results (``rfactor``); pointwise stages are vectorized; rows run in parallel.
    Returns False when the kernel does not have that shape.
    """
    blocks = [sch.get_sblock(n) for n in names]
    reductions = [b for b in blocks if any(int(iv.iter_type) == REDUCE for iv in sch.get(b).iter_vars)]
    if len(blocks) < 2 or not reductions or any(block_kind(sch, n) == "anchor" for n in names):
        return False
    out_shape = [int(d) for d in sch.get(blocks[-1]).writes[0].source.shape]
    rows = len(out_shape)
    for b in reductions:
        shape = [int(d) for d in sch.get(b).writes[0].source.shape]
        if len(shape) != len(out_shape):
            return False
        rows = min(rows, next((d for d, (s, o) in enumerate(zip(shape, out_shape)) if s != o), len(shape)))
    if rows == 0 or rows == len(out_shape):
        return False
    lanes = _lanes(sch, blocks[-1], config)
    rfs = {}
    for b in reductions:  # vector partial sums, before the blocks move (rfactor wants a root loop nest)
        name = sch.get(b).name_hint
        loops = sch.get_loops(b)
        factor = _vector_factor(int(sch.get(loops[-1]).extent), lanes)
        if factor and int(sch.get(loops[-1]).extent) >= 2 * factor:
            _, ki = sch.split(loops[-1], [None, factor])
            rfs[name] = sch.get(sch.rfactor(ki, factor_axis=0)).name_hint
    order = [m for n in names[:-1] for m in ([rfs[n]] if n in rfs else []) + [n]]
    out = sch.get_sblock(names[-1])
    out_loops = sch.get_loops(out)
    row = sch.fuse(*out_loops[:rows]) if rows > 1 else out_loops[0]
    _vectorize_tail(sch, sch.get_loops(out)[1:], lanes)
    for name in reversed(order):
        sch.compute_at(sch.get_sblock(name), row)
    for name in order:
        block = sch.get_sblock(name)
        inner = sch.get_loops(block)[1:]
        kinds = [int(iv.iter_type) for iv in sch.get(block).iter_vars]
        if name in rfs.values():  # loops (ki, ko): the vector lane innermost
            spatial = [l for l in inner if int(sch.get(l).extent) == _rf_lanes(sch, block)]
            if spatial:
                others = [l for l in inner if not l.same_as(spatial[0])]
                sch.reorder(*others, spatial[0])
                sch.vectorize(spatial[0])
        elif REDUCE not in kinds:
            _vectorize_tail(sch, inner, lanes)
    if math.prod(out_shape) >= config.parallel_min_elems and config.cores > 1:
        sch.parallel(row)
    return True


def _rf_lanes(sch: s_tir.Schedule, rf_block) -> int:
    return int(sch.get(rf_block).writes[0].source.shape[0])


def _vectorize_tail(sch: s_tir.Schedule, loops, lanes: int) -> None:
    """Vectorize the innermost of ``loops`` (fusing short trailing loops first)."""
    if not loops:
        return
    loops = list(loops)
    if len(loops) > 1 and int(sch.get(loops[-1]).extent) < lanes:
        loops = [sch.fuse(*loops)]
    n = int(sch.get(loops[-1]).extent)
    factor = _vector_factor(n, lanes)
    if factor and n > factor:
        sch.vectorize(sch.split(loops[-1], [None, factor])[1])
    elif factor or 2 <= n <= 2 * lanes:
        sch.vectorize(loops[-1])


def inline_intermediates(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Inline every elementwise block whose result only feeds other blocks of ``func`` (TVM's
    FuseTIR keeps one block per fused op, each writing a full intermediate buffer)."""
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        for inline in (sch.compute_inline, sch.reverse_compute_inline):
            try:
                inline(block)
                break
            except (s_tir.ScheduleError, tvm.error.InternalError, RuntimeError):
                continue
    return sch.mod["main"]


def block_kind(sch: s_tir.Schedule, name: str) -> str:
    """'pointwise', 'row_reduce' or 'anchor' (or 'reduce' when neither pattern is found)."""
    block = sch.get(sch.get_sblock(name))
    ivars = list(block.iter_vars)
    spatial = [iv.var for iv in ivars if int(iv.iter_type) == SPATIAL]
    reduce = [iv.var for iv in ivars if int(iv.iter_type) == REDUCE]
    if not reduce:
        return "pointwise"
    last_dims = [r.region[-1].min for r in block.reads if len(r.region)]
    if spatial and any(_unit_stride(e, spatial[-1]) for e in last_dims) and _extent(ivars, spatial[-1]) >= 4:
        return "anchor"
    if any(_unit_stride(e, reduce[-1]) for e in last_dims):
        return "row_reduce"
    return "reduce"


def _extent(ivars, var) -> int:
    return next(int(iv.dom.extent) for iv in ivars if iv.var.same_as(var))


def _unit_stride(expr, var) -> bool:
    coeffs = tvm.sym.detect_linear_equation(expr, [var])
    return len(coeffs) == 2 and isinstance(coeffs[0], tirx.IntImm) and int(coeffs[0]) == 1


def _plans(sch: s_tir.Schedule, name: str, fuse_epilogue: bool):
    kind = block_kind(sch, name)
    if kind == "pointwise":
        return [_pointwise, _parallel_only]
    if kind == "anchor":
        return [_anchor_with_epilogue, _anchor, _parallel_only] if fuse_epilogue else [_anchor, _parallel_only]
    if kind == "row_reduce":
        return [_row_reduce, _parallel_only]
    return [_parallel_only]


def _lanes(sch: s_tir.Schedule, block, config: ScheduleConfig) -> int:
    buf = sch.get(block).writes[0].source
    return max(1, config.vector_bytes // max(1, tvm.DataType(str(buf.dtype)).bits // 8))


def _loop_extents(sch: s_tir.Schedule, loops) -> list[int]:
    return [int(sch.get(l).extent) for l in loops]


def _vector_factor(n: int, lanes: int) -> int:
    """The widest vector (lanes, lanes/2, ... 4) that divides ``n``; 0 if none."""
    f = lanes
    while f >= 4:
        if n % f == 0:
            return f
        f //= 2
    return 0


def _parallelize(sch: s_tir.Schedule, loops, total: int, config: ScheduleConfig) -> None:
    if loops and total >= config.parallel_min_elems and config.cores > 1:
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        if int(sch.get(fused).extent) > 1:
            sch.parallel(fused)


def _pointwise(sch: s_tir.Schedule, block, config: ScheduleConfig) -> None:
    loops = sch.get_loops(block)
    if not loops:
        return
    extents = _loop_extents(sch, loops)
    total = math.prod(extents)
    lanes = _lanes(sch, block, config)
    if extents[-1] < lanes and len(loops) > 1:  # short rows: vectorize across them
        loops = [sch.fuse(*loops)]
        extents = [total]
    factor = _vector_factor(extents[-1], lanes)
    outer = list(loops[:-1])
    if factor and extents[-1] > factor:
        o, vec = sch.split(loops[-1], [None, factor])
        outer.append(o)
        sch.vectorize(vec)
    elif factor or 2 <= extents[-1] <= 2 * lanes:
        sch.vectorize(loops[-1])
    else:
        outer.append(loops[-1])
    _parallelize(sch, outer, total, config)


def _parallel_only(sch: s_tir.Schedule, block, config: ScheduleConfig) -> None:
    ivars = sch.get(block).iter_vars
    loops = sch.get_loops(block)
    n_lead = 0
    for iv in ivars:  # only the leading run of spatial loops may be fused and parallel
        if int(iv.iter_type) != SPATIAL:
            break
        n_lead += 1
    _parallelize(sch, list(loops[:n_lead]), math.prod(_loop_extents(sch, loops)), config)


def _row_reduce(sch: s_tir.Schedule, block, config: ScheduleConfig) -> None:
    ivars = sch.get(block).iter_vars
    loops = sch.get_loops(block)
    n_spatial = sum(1 for iv in ivars if int(iv.iter_type) == SPATIAL)
    lanes = _lanes(sch, block, config)
    nk = int(sch.get(loops[-1]).extent)
    factor = _vector_factor(nk, lanes)
    if not factor or nk < 2 * factor:
        raise ValueError("reduce axis too short to vectorize")
    _, ki = sch.split(loops[-1], [None, factor])
    rf = sch.rfactor(ki, factor_axis=n_spatial)  # rf loops: spatial..., ko, ki (ki now spatial)
    rf_loops = sch.get_loops(rf)
    sch.vectorize(rf_loops[-1])
    if n_spatial:  # one row's partial sums: a vector accumulator, then the horizontal sum
        sch.reverse_compute_at(block, rf_loops[n_spatial - 1])
    total = math.prod(int(iv.dom.extent) for iv in ivars)
    _parallelize(sch, list(rf_loops[:n_spatial]), total, config)


def _anchor(sch: s_tir.Schedule, block, config: ScheduleConfig, epilogue=None) -> list[str]:
    ivars = sch.get(block).iter_vars
    loops = sch.get_loops(block)
    kinds = [int(iv.iter_type) for iv in ivars]
    spatial = [l for l, t in zip(loops, kinds) if t == SPATIAL]
    reduce = [l for l, t in zip(loops, kinds) if t == REDUCE]
    lanes = _lanes(sch, block, config)
    nj = int(sch.get(spatial[-1]).extent)
    tile_j = _vector_factor(nj, 2 * lanes) or (nj if nj <= 2 * lanes else 0)
    if not tile_j:
        raise ValueError("no vector tile for the innermost axis")
    jo, ji = sch.split(spatial[-1], [None, tile_j])
    outer = list(spatial[:-1])
    inner = [ji]
    if len(spatial) >= 2:
        ni = int(sch.get(spatial[-2]).extent)
        tile_i = next((t for t in (4, 8, 2) if ni % t == 0 and ni > t), 1)
        if tile_i > 1:
            io, ii = sch.split(spatial[-2], [None, tile_i])
            outer = outer[:-1] + [io]
            inner = [ii, ji]
    sch.reorder(*outer, jo, *reduce, *inner)
    # The i x j accumulator tile: the epilogue's input (the anchor's kernel-local buffer,
    # shrunk to the tile by TVM's buffer compaction), or a cache of the output.
    tail = epilogue if epilogue is not None else sch.cache_write(block, 0, "global")
    sch.reverse_compute_at(tail, jo)
    sch.vectorize(sch.get_loops(tail)[-1])
    sch.vectorize(ji)
    if len(inner) == 2:
        sch.unroll(inner[0])
    total = math.prod(int(iv.dom.extent) for iv in ivars if int(iv.iter_type) == SPATIAL)
    _parallelize(sch, [*outer, jo], total, config)
    sch.decompose_reduction(block, reduce[0])
    return [sch.get(epilogue).name_hint] if epilogue is not None else []


def _anchor_with_epilogue(sch: s_tir.Schedule, block, config: ScheduleConfig) -> list[str]:
    """The anchor plan, with its one elementwise consumer computed on each output tile."""
    consumers = sch.get_consumers(block)
    if len(consumers) != 1:
        raise ValueError("no single epilogue")
    epilogue = consumers[0]
    anchor_ext = [int(iv.dom.extent) for iv in sch.get(block).iter_vars if int(iv.iter_type) == SPATIAL]
    epi_vars = sch.get(epilogue).iter_vars
    if any(int(iv.iter_type) != SPATIAL for iv in epi_vars) or [int(iv.dom.extent) for iv in epi_vars] != anchor_ext:
        raise ValueError("the consumer is not an elementwise epilogue of the same shape")
    return _anchor(sch, block, config, epilogue)
