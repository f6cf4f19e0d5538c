"""What a schedule needs to know about a kernel's blocks, read from its TIR alone."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from schedules.host_cpu import host_caches, host_cpu_name

SPATIAL, REDUCE = 0, 2


@dataclass(frozen=True)
class Machine:
    """The target's shape, as schedules see it."""

    cores: int = len(os.sched_getaffinity(0))
    vector_bytes: int = 64  # AVX-512
    l1_bytes: int = 48 << 10
    l2_bytes: int = 2 << 20  # per core
    l3_bytes: int = 32 << 20
    parallel_min_elems: int = 4096  # below this a parallel launch costs more than it saves
    cpu: str = ""  # the CPU's model where known (the host's): tuning records name it

    @classmethod
    def for_target(cls, target: tvm.target.Target) -> "Machine":
        """The machine a target describes: its vector width from LLVM's features for its mcpu
        and mattr (AVX-512: 64 bytes, AVX/AVX2: 32, plain x86-64's SSE2: 16). A target for
        this host's CPU also takes the host's cache sizes and model from the OS; any other
        keeps the defaults (the host's caches say nothing of another CPU)."""
        cores = int(target.attrs.get("num-cores", 0) or len(os.sched_getaffinity(0)))
        machine = cls(cores=cores, vector_bytes=vector_bytes(target))
        if is_host(target):
            caches = host_caches()
            machine = replace(machine, cpu=host_cpu_name(),
                              **({} if caches is None else dict(l1_bytes=caches.l1d, l2_bytes=caches.l2,
                                                                l3_bytes=caches.l3)))
        return machine

    @property
    def vector_bits(self) -> int:
        return self.vector_bytes * 8


def is_host(target: tvm.target.Target) -> bool:
    """Whether ``target`` is an LLVM target for exactly this host's CPU."""
    return target.kind.name == "llvm" and str(target.attrs.get("mcpu", "")) == \
        tvm.target.codegen.llvm_get_system_cpu()


def _has(feature: str, target: tvm.target.Target) -> bool:
    mattr = [str(a) for a in target.attrs.get("mattr", []) or []]
    if f"+{feature}" in mattr:
        return True
    if f"-{feature}" in mattr:
        return False
    try:
        return bool(tvm.target.codegen.target_has_features(feature, target))
    except Exception:  # noqa: BLE001 - not an LLVM x86 target: no such feature
        return False


def has_avx512(target: tvm.target.Target) -> bool:
    return _has("avx512f", target)


def vector_bytes(target: tvm.target.Target) -> int:
    if has_avx512(target):
        return 64
    return 32 if _has("avx", target) else 16


@dataclass(frozen=True)
class BlockInfo:
    """One block: its kind and iteration extents."""

    name: str
    kind: str  # "pointwise", "transpose", "row_reduce", "anchor", "reduce"
    spatial: tuple[int, ...]
    reduce: tuple[int, ...]
    dtype_bits: int
    period: int = 0  # an anchor reading an operand packed in panels of this many columns
    uniform: bool = False  # every read is one element at the block's own index: merging its
    # axes into one keeps every load contiguous (no div/mod of a broadcast index)

    @property
    def size(self) -> int:
        return math.prod(self.spatial)

    def lanes(self, machine: Machine) -> int:
        return max(1, machine.vector_bytes * 8 // self.dtype_bits)


def _uniform(block, ivars) -> bool:
    own = [iv.var for iv in ivars]
    for region in block.reads:
        ranges = list(region.region)
        if len(ranges) != len(own) or not all(
                r.min.same_as(v) and isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1
                for r, v in zip(ranges, own)):
            return False
    return True


def block_infos(sch: s_tir.Schedule) -> list[BlockInfo]:
    out = []
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        ivars = list(block.iter_vars)
        spatial = tuple(int(iv.dom.extent) for iv in ivars if int(iv.iter_type) == SPATIAL)
        reduce = tuple(int(iv.dom.extent) for iv in ivars if int(iv.iter_type) == REDUCE)
        bits = tvm.DataType(str(block.writes[0].source.dtype)).bits
        kind, period = _kind(block)
        out.append(BlockInfo(block.name_hint, kind, spatial, reduce, bits, period, _uniform(block, ivars)))
    return out


def _kind(block) -> tuple[str, int]:
    """The block's kind, and for an anchor whose operand is packed in column panels
    (``Wp[j // p, k, j % p]``, see ``relay_passes.pack_weights``) the panel width p."""
    last_dims = _last_read_indices(block)
    kind = _kind_of(block, last_dims)
    if kind != "anchor":
        return kind, 0
    spatial = [iv.var for iv in block.iter_vars if int(iv.iter_type) == SPATIAL]
    periods = [_period(e, spatial[-1]) for e in last_dims]
    return kind, min([p for p in periods if p], default=0)


def _last_read_indices(block) -> list:
    """Each read's index along its last axis, simplified with the block's iteration ranges
    (a view chain leaves ``j % 1024 // 32`` where ``j // 32`` is meant)."""
    analyzer = tvm.sym.Analyzer()
    for iv in block.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    return [analyzer.simplify(r.region[-1].min) for r in block.reads if len(r.region)]


def _period(expr, var) -> int:
    """p when ``expr`` is ``var % p`` (contiguous within each panel of p columns), else 0."""
    if isinstance(expr, tirx.FloorMod) and expr.a.same_as(var) and isinstance(expr.b, tirx.IntImm):
        return int(expr.b)
    return 0


def _kind_of(block, last_dims: list) -> str:
    ivars = list(block.iter_vars)
    spatial = [iv.var for iv in ivars if int(iv.iter_type) == SPATIAL]
    reduce = [iv.var for iv in ivars if int(iv.iter_type) == REDUCE]
    if not reduce:
        if spatial and last_dims and not any(_unit_stride(e, spatial[-1]) or _constant(e) for e in last_dims):
            return "transpose"  # no read is contiguous along the innermost written axis
        return "pointwise"
    extent = {iv.var: int(iv.dom.extent) for iv in ivars}
    if spatial and extent[spatial[-1]] >= 4 and any(_unit_stride(e, spatial[-1]) or _period(e, spatial[-1]) >= 4
                                                   for e in last_dims):
        return "anchor"
    if any(_unit_stride(e, reduce[-1]) for e in last_dims):
        return "row_reduce"
    return "reduce"


def _unit_stride(expr, var) -> bool:
    coeffs = tvm.sym.detect_linear_equation(expr, [var])
    return len(coeffs) == 2 and isinstance(coeffs[0], tirx.IntImm) and int(coeffs[0]) == 1


def _constant(expr) -> bool:
    return not tirx.analysis.undefined_vars(expr, [])


def vector_factor(n: int, lanes: int) -> int:
    """The widest vector (lanes, lanes/2, ... 4) that divides ``n``; 0 if none."""
    f = lanes
    while f >= 4:
        if n % f == 0:
            return f
        f //= 2
    return 0


_ARITHMETIC = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Min, tirx.Max, tirx.Select, tvm.ir.Call)


def arithmetic_ops(stmt) -> int:
    """How many arithmetic operations one execution of ``stmt`` (a block body) evaluates."""
    count = 0

    def seen(_):
        nonlocal count
        count += 1

    tvm_ffi.structural_walk(stmt, (_ARITHMETIC, seen))
    return count
