"""Schedule policies: each builds one kind of ScheduleResult from knobs.

A policy is a small class: ``applies(info)`` says whether it fits a block, ``space(info)``
lists the values each knob may take (the tuner's search space), ``default(info)`` picks
knobs from shapes alone, and ``apply(builder, info, knobs)`` transforms the block's
ImplGraph (and, for multi-block forms, its neighbours') on the schedule. The transforms
are the seed's: block split (the BlockOuter axis runs across the cores), tile split,
merge of consecutive axes, reorder; plus the CPU's vectorize and unroll and the
multi-block rfactor / compute_at / cache_write.
"""
from __future__ import annotations

import itertools
import math
from typing import Iterator

import tvm
from tvm import s_tir

from schedules.analysis import (BlockInfo, arithmetic_ops, input_stages, row_vector, stmt, vector_factor,
                                widest_divisor)
from schedules.axes import MAX_VECTOR_LANES, ImplGraph
from schedules.builder import ScheduleBuilder
from schedules.primitives import prim
from tvm_ext.machine import Machine


#: What a policy's ``apply`` raises when it does not fit a schedule (the trial is dropped).
FAILURES = (s_tir.ScheduleError, tvm.error.InternalError, RuntimeError, ValueError, KeyError)


class Policy:
    """``KNOBS`` declares the knobs, in order; ``space`` gives each its values for a block and
    ``default`` the heuristic's choice. The heuristic, the search space, the cost model's
    features and the records all read these, so a knob is added in its policy alone."""

    name = "policy"
    KNOBS: tuple[str, ...] = ()
    whole_kernel = False  # one form for the whole kernel, tried before the per-block policies

    def __init__(self, machine: Machine):
        self.machine = machine

    def applies(self, info: BlockInfo, builder: ScheduleBuilder) -> bool:
        raise NotImplementedError

    def space(self, info: BlockInfo) -> dict[str, list]:
        return {}

    def default(self, info: BlockInfo, fuse_epilogue: bool = True) -> dict:
        """The heuristic's knobs: each knob's first value, unless the policy knows better."""
        return {k: v[0] for k, v in self.space(info).items()}

    def trial(self, builder: ScheduleBuilder, info: BlockInfo, knobs: dict,
              label: str | None = None) -> tuple[ScheduleBuilder, list[str]] | None:
        """The policy applied to a copy of ``builder`` and the choice recorded on it under
        ``label`` (default: ``name@block``); with the blocks it claimed. None if it does not fit."""
        trial = builder.copy()
        try:
            claimed = self.apply(trial, info, dict(knobs))
        except FAILURES:
            return None
        trial.choose(label or f"{self.name}@{info.name}", knobs)
        return trial, list(claimed or [])

    def candidates(self, info: BlockInfo) -> Iterator[dict]:
        """Every knob setting of the space, once each: a knob's values can coincide (a lane
        count equal to a fixed choice at 256-bit vectors), and a repeat would be measured twice."""
        space = self.space(info)
        keys = list(space)
        for values in itertools.product(*(list(dict.fromkeys(space[k])) for k in keys)):
            yield dict(zip(keys, values))

    def apply(self, builder: ScheduleBuilder, info: BlockInfo, knobs: dict) -> list[str]:
        """Transform the block; return the names of the blocks it scheduled."""
        raise NotImplementedError

    # shared pieces -----------------------------------------------------------------
    def parallel_outer(self, builder: ScheduleBuilder, block: str, names: list[str], work: int) -> None:
        """Merge ``names`` and block-split the result over the cores: its BlockOuter axis (one
        per ImplGraph) runs one chunk per core."""
        if not names or work < self.machine.parallel_min_elems or self.machine.cores < 2:
            return
        impl = builder.impl(block)
        outer = impl.merge_all(names)
        size = impl[outer].size
        if size < 2:
            return
        if size > self.machine.cores:
            outer, _ = impl.block_split(outer, math.ceil(size / self.machine.cores))
        impl.mark_parallel(outer)

    def vectorize_tail(self, builder: ScheduleBuilder, block: str, name: str, vector: int) -> str | None:
        """Tile-split ``name`` by ``vector`` and vectorize the inner part; returns the outer
        axis (None when the whole axis became the vector)."""
        impl = builder.impl(block)
        size = impl[name].size
        if vector and size > vector and size % vector == 0:
            outer, inner = impl.tile_split(name, vector)
            impl.mark_vectorized(inner)
            return outer
        if 2 <= size <= 2 * self.lanes_of(builder, block):
            impl.mark_vectorized(name)
        return None if size <= 2 * self.lanes_of(builder, block) else name

    def lanes_of(self, builder: ScheduleBuilder, block: str) -> int:
        import tvm
        bits = tvm.DataType(str(builder.block(block).writes[0].source.dtype)).bits
        return max(1, self.machine.vector_bytes * 8 // bits)


# ---------------------------------------------------------------------- pointwise
class MergeAllBlockVectorize(Policy):
    """Merge every axis into one, block-split it over the cores, vectorize a tile of it."""

    name = "merge_all"
    KNOBS = ("vector",)

    def applies(self, info, builder):
        return info.kind in ("pointwise", "transpose") and info.size >= 4

    def space(self, info):
        lanes = info.lanes(self.machine)
        vectors = [v for v in (lanes * 2, lanes, lanes // 2, 4) if v >= 4 and info.size % v == 0]
        return {"vector": sorted(set(vectors), reverse=True) or [0]}

    def apply(self, builder, info, knobs):
        impl = builder.impl(info.name)
        z = impl.merge_all(impl.names)
        outer = self.vectorize_tail(builder, info.name, z, knobs["vector"])
        if outer is not None:
            self.parallel_outer(builder, info.name, [outer], info.size)
        return [info.name]


class Keep2D(Policy):
    """Keep the innermost axis (with any axes of 1 after it): block-split the merged outer axes
    over the cores, vectorize the inner axis (no div/mod in the inner loop's indices). Where no
    whole vector divides that axis, its widest divisor up to two vectors (30 lanes of 900)
    beats a quarter of one (4 lanes): GroupNorm + SiLU over (4, 48, 900), 0.074 -> 0.037 ms on
    a Zen 4; built for AVX2 there, (4, 48, 30, 30), whose 30 took no vector, 0.085 -> 0.051."""

    name = "keep_2d"
    KNOBS = ("vector", "unroll")

    def applies(self, info, builder):
        return info.kind in ("pointwise", "transpose") and info.inner >= 1 and info.spatial[info.inner] >= 4

    def space(self, info):
        n, lanes = info.spatial[info.inner], info.lanes(self.machine)
        vectors = [v for v in (lanes * 2, lanes, lanes // 2, 4) if v >= 4 and n % v == 0]
        if n % lanes:
            vectors += [row_vector(n, lanes)]
        return {"vector": sorted(set(vectors), reverse=True) or [0], "unroll": [False, True]}

    def apply(self, builder, info, knobs):
        impl = builder.impl(info.name)
        names = impl.names
        inner = impl.merge_all(names[info.inner:]) if info.inner < len(names) - 1 else names[-1]
        rest = self.vectorize_tail(builder, info.name, inner, knobs["vector"])
        if rest is not None and knobs.get("unroll") and impl[rest].size <= 8:
            impl.mark_unrolled(rest)
            rest = None
        outer = names[:info.inner] + ([rest] if rest is not None else [])
        self.parallel_outer(builder, info.name, outer, info.size)
        return [info.name]


class TransposeTile(Policy):
    """Tile the last two axes so a transposed read and the write both touch whole cache
    lines; the outer tile axis runs across the cores, the inner one is vectorized."""

    name = "transpose_tile"
    KNOBS = ("tile",)

    def applies(self, info, builder):
        return info.kind == "transpose" and len(info.spatial) >= 2 and min(info.spatial[-2:]) >= 8

    def space(self, info):
        a, b = info.spatial[-2:]
        tiles = [t for t in (32, 16, 8) if a % t == 0 and b % t == 0]
        return {"tile": tiles or [0]}

    def apply(self, builder, info, knobs):
        t = knobs["tile"]
        if not t:
            raise ValueError("no tile divides both axes")
        impl = builder.impl(info.name)
        *outer, zi, zj = impl.names
        iT, it = impl.tile_split(zi, t)
        jT, jt = impl.tile_split(zj, t)
        impl.reorder(jT, it)
        impl.mark_vectorized(jt)
        self.parallel_outer(builder, info.name, [*outer, iT], info.size)
        return [info.name]


class ReadTile(Policy):
    """A transpose whose reads are contiguous along another output axis than the last (a
    blocked layout's channels, read back into NCHW): vectorize that axis, so every load is a
    whole vector, and unroll a tile of the last axis; each lane is stored on its own. On a
    Zen 5, NCHW16c -> NCHW with BN and ReLU at 32x56x56: 5 us, against 29 us for the tile
    that vectorizes the written axis and gathers its reads.

    The tile is 4 positions unless tuned: at 8, the 128 lone stores of a 16-lane tile sit in one
    loop body, and LLVM's LoopLoadElimination compares them pairwise (127 ms of the
    conv-bn-relu kernel's 200 ms of optimization, Zen 4). At 4 the kernels run as fast
    (interleaved, 41 rounds: conv-bn-relu 0.994x, the transformer's QKV projection 0.987x) and
    build in 0.65-0.75x the time (conv-bn-relu 265 -> 178 ms, QKV 133 -> 101 ms, the ResNet
    block's NCHW16c -> NCHW 85 -> 44 ms; built for znver3, 0.70-0.82x)."""

    name = "read_tile"
    KNOBS = ("vector", "tile")

    def applies(self, info, builder):
        return info.kind == "transpose" and info.read_axis[0] >= 0 and len(info.spatial) >= 2

    def space(self, info):
        axis, period = info.read_axis
        run = period or info.spatial[axis]
        lanes = info.lanes(self.machine)
        vectors = [v for v in (lanes, lanes // 2, 4) if v >= 4 and run % v == 0 and info.spatial[axis] % v == 0]
        last = info.spatial[-1]
        return {"vector": vectors or [0], "tile": [t for t in (4, 8, 16) if last % t == 0 and last > t] or [0]}

    def apply(self, builder, info, knobs):
        v = knobs["vector"]
        if not v:
            raise ValueError("no vector divides the contiguous run")
        impl = builder.impl(info.name)
        names = impl.names
        _, at = impl.tile_split(names[info.read_axis[0]], v)
        inner = [at]
        if knobs["tile"]:
            _, lt = impl.tile_split(names[-1], knobs["tile"])
            inner = [lt, at]
        outer = [n for n in impl.names if n not in inner]
        impl.reorder(*outer, *inner)
        impl.mark_vectorized(at)
        if len(inner) == 2:
            impl.mark_unrolled(inner[0])
        lead = []
        for n in outer:  # the axes before the first one a split moved can merge and run on the cores
            if impl[n].reordered:
                break
            lead.append(n)
        self.parallel_outer(builder, info.name, lead, info.size)
        return [info.name]


# ---------------------------------------------------------------------- reductions
class RowPerCore(Policy):
    """Rows across the cores; each row keeps a vector of partial sums (rfactor on a vector-
    wide split of the reduce axis), then sums the vector. Reduce axes that the reads walk as
    one contiguous run (``BlockInfo.flat_reduce``) are merged into that row first: a group
    norm's 6 x 30 x 30 becomes one row of 5400, where 30 alone takes no vector. Knob
    ``accumulators``: at most that many vectors of partial sums (the most that divide the
    row's vector steps), independent chains of adds instead of one, combined as vectors."""

    name = "row_per_core"
    KNOBS = ("vector", "accumulators")

    def applies(self, info, builder):
        return info.kind == "row_reduce" and self.row(info) >= 8

    @staticmethod
    def row(info: BlockInfo) -> int:
        return math.prod(info.reduce) if info.flat_reduce else info.reduce[-1]

    def space(self, info):
        lanes, row = info.lanes(self.machine), self.row(info)
        vectors = [v for v in (lanes, lanes // 2, 4) if v >= 4 and row % v == 0 and row >= 2 * v]
        if not vectors:  # no power of two divides the row: its widest divisor up to a vector, 7 of
            # 49 (8x512 means over 7x7, a global average pool: 36.8 -> 12.4 us, Zen 4; the rows ran
            # as scalar loops under parallel_only)
            vectors = [widest_divisor(row, min(lanes, row // 2), 3)]
        return {"vector": vectors, "accumulators": [1, 8]}

    def default(self, info, fuse_epilogue=True):
        knobs = super().default(info, fuse_epilogue)
        # a long row is a long chain of dependent vector adds (4 cycles each): a group norm's
        # statistics over 5400 = 675 x 8 lanes in 5 chains, 4x48x30x30: 35 -> 22 us (AVX-512 Xeon)
        steps = self.row(info) // knobs["vector"] if knobs["vector"] else 0
        knobs["accumulators"] = 8 if steps >= 64 and self.chains(steps, 8) > 1 else 1
        return knobs

    @staticmethod
    def chains(steps: int, most: int) -> int:
        """The most accumulators, at most ``most``, that divide ``steps`` vector steps (1 if none)."""
        return next((a for a in range(most, 1, -1) if steps % a == 0 and steps >= 2 * a), 1)

    def apply(self, builder, info, knobs):
        v = knobs["vector"]
        if not v:
            raise ValueError("reduce axis too short to vectorize")
        impl = builder.impl(info.name)
        spatial = [a.name for a in impl.axis if not a.reduce]
        reduce = [a.name for a in impl.axis if a.reduce]
        k = impl.merge_all(reduce) if info.flat_reduce else reduce[-1]
        ko, kt = impl.tile_split(k, v)
        acc = self.chains(impl[ko].size, knobs.get("accumulators", 1))
        if acc > 1:
            impl.tile_split(ko, acc)
        rf = builder.rfactor(info.name, kt, factor_axis=len(spatial))
        builder.groups[info.name].role = "row reduction"
        if acc > 1:  # the acc vectors' chains, then one vector (the combine), then the lanes
            combine = rf
            rf = builder.rfactor(combine, [a.name for a in builder.impl(combine).axis if a.reduce][-1],
                                 factor_axis=len(spatial))
            builder.groups[combine].role = "vector combine"
        rf_impl = builder.impl(rf)
        rf_impl.mark_vectorized(rf_impl.names[-1])
        if acc > 1:
            rf_impl.mark_unrolled(rf_impl.names[-2])
        if spatial:
            row = rf_impl.names[len(spatial) - 1]
            if acc > 1:
                builder.reverse_compute_at(combine, rf, row)
            builder.reverse_compute_at(info.name, rf, row)
            self.parallel_outer(builder, rf, rf_impl.names[:len(spatial)], info.size * math.prod(info.reduce))
        return [info.name, rf] + ([combine] if acc > 1 else [])


class SplitReduction(Policy):
    """Few long rows: split the reduce axis across the cores (rfactor on its block-outer
    part), each core summing a chunk, then combine the chunks."""

    name = "split_reduction"
    KNOBS = ("chunks",)

    def applies(self, info, builder):
        return info.kind in ("row_reduce", "reduce") and info.size < self.machine.cores * 4 \
            and math.prod(info.reduce) >= 1 << 14

    def space(self, info):
        return {"chunks": [self.machine.cores, 2 * self.machine.cores, 8 * self.machine.cores]}

    def apply(self, builder, info, knobs):
        impl = builder.impl(info.name)
        reduce = [a.name for a in impl.axis if a.reduce]
        k = impl.merge_all(reduce)
        n = impl[k].size
        chunk = math.ceil(n / knobs["chunks"])
        kB, _ = impl.block_split(k, chunk)
        chunks = impl[kB].size
        rf = builder.rfactor(info.name, kB, factor_axis=0)
        rf_impl = builder.impl(rf)
        lane = next(a.name for a in rf_impl.axis if not a.reduce and a.size == chunks)
        first = rf_impl.names[0]
        if lane != first:
            rf_impl.reorder(lane, first)
        rf_impl.mark_parallel(lane)
        builder.groups[info.name].role = "combine chunks"
        return [info.name, rf]


class ParallelOnly(Policy):
    """The fallback: the leading spatial loops merged and run across the cores."""

    name = "parallel_only"

    def applies(self, info, builder):
        return True

    def apply(self, builder, info, knobs):
        impl = builder.impl(info.name)
        lead = []
        for a in impl.axis:
            if a.reduce:
                break
            lead.append(a.name)
        self.parallel_outer(builder, info.name, lead, info.size * max(1, math.prod(info.reduce)))
        return [info.name]


# ---------------------------------------------------------------------- anchors
class RegisterTiledAnchor(Policy):
    """matmul / conv2d: an i x j register tile (j vectorized, i unrolled) accumulated over the
    reduce loops, then written out on the tile: through its epilogue when the kernel has
    one (the epilogue runs on the tile), else through a cached output tile.

    ``k_block`` > 0 blocks the reduction for large operands: for each chunk of k, all j
    tiles, then all i tiles (the chunk of B stays in cache across the i tiles); the tile
    then accumulates in the output itself and the epilogue runs once per core's block of
    rows, after the last chunk. ``i_block`` > 0 (with ``k_block``) also blocks the rows, so
    that the rows of A one k chunk reads stay in L2 across the j tiles. ``stage`` moves the
    kernel's own input stages (a convolution's padded input) under the loop over the cores,
    so each core writes the part its tiles read and reads it back from its own cache."""

    name = "register_tile"
    KNOBS = ("tile_i", "tile_j", "k_unroll", "epilogue", "k_block", "i_block", "tile_b", "stage")
    # a stage moves under the cores' loop while the cores together redo at most this share more
    # of it than it holds (a 3x3 convolution's padded rows at 56 rows on 2 cores: 30 + 30 of 58)
    STAGE_REDUNDANCY = 1.25

    def applies(self, info, builder):
        return info.kind == "anchor"

    def space(self, info):
        lanes = info.lanes(self.machine)
        nj = info.spatial[-1]
        tiles_j = [t for t in (2 * lanes, lanes, lanes // 2) if t >= 4 and nj % t == 0] or \
            ([nj] if nj <= 2 * lanes else [0])
        if info.period:  # an operand packed in column panels: a tile stays inside one panel
            tiles_j = [t for t in tiles_j if t and info.period % t == 0] or [0]
        ni = info.spatial[-2] if len(info.spatial) > 1 else 1
        if len(info.spatial) == 1 and 4 * lanes <= MAX_VECTOR_LANES and nj % (4 * lanes) == 0 and not info.period:
            # one output row (a column sum): its tile is one row, so four vectors of it are four
            # chains of adds, and each row of the input is read four vectors at a time. Kernels
            # alone, Zen 4: x.mean(0) of 4096 x 512 0.111 -> 0.072 ms (znver3 0.147 -> 0.120),
            # x.sum(0) of 256 x 1024 0.022 -> 0.011 (0.028 -> 0.020)
            tiles_j = [4 * lanes] + tiles_j
        # a short row axis (a transformer's 4 sequences) may be the whole tile: 2 rows of 32 are
        # 4 accumulators, too few to hide the FMA latency (QKV projection 134 -> 311 GFLOP/s)
        tiles_i = [t for t in (4, 8, 2, 6, 1) if ni % t == 0 and (ni > t or t == 1 or ni <= 8)] or [1]
        nk = info.reduce[-1]
        k_blocks = [0] + [b for b in (256, 128, 512) if nk % b == 0 and nk > b]
        i_blocks = [0] + [b for b in (256, 128) if ni > b * self.machine.cores]
        tiles_b = [1]
        if info.reuse_axis >= 0:
            nb = info.spatial[info.reuse_axis]
            tiles_b += [b for b in (2, 4) if nb % b == 0]
        return {"tile_j": tiles_j, "tile_i": tiles_i, "k_unroll": [1, 4], "epilogue": [True, False],
                "k_block": k_blocks, "i_block": i_blocks, "tile_b": tiles_b,
                "stage": [True, False] if info.stages else [False]}

    def candidates(self, info):
        """The space's settings whose register tile holds enough sums for the FMA units
        (``Machine.tile_accumulators``), or where no tile that fits the registers does (a short
        row axis; Haswell's 80 sums at 512, where 6 rows do not divide it), as many as the
        largest that fits. Six GEMMs and convolutions measured on a Zen 4 (all 121 candidates of
        matmul 512's space, 300 drawn at random from each of the others'): built for znver4, the
        smaller tiles were 44-53% of them and the fastest 1.55-1.78x as slow as the best; built
        for znver3, 62-75% and 1.65-1.73x. None was within 5% of the best."""
        settings = list(super().candidates(info))
        lanes = info.lanes(self.machine)
        sums = [self.tile_sums(k) for k in settings]
        fitting = [n for k, n in zip(settings, sums) if self.registers(k, lanes) <= self.machine.vector_registers]
        floor = min(self.machine.tile_accumulators(info.dtype_bits), max(fitting or sums, default=0))
        return iter([k for k, n in zip(settings, sums) if n >= floor])

    @staticmethod
    def tile_sums(knobs: dict) -> int:
        """The sums a tile accumulates at once: rows x columns x steps of the reuse axis."""
        return knobs["tile_i"] * knobs["tile_j"] * knobs["tile_b"]

    @staticmethod
    def registers(knobs: dict, lanes: int) -> int:
        """The vector registers a tile takes: its sums, a row of B for each step of the reuse
        axis, and the broadcast of A."""
        vectors_j = max(1, knobs["tile_j"] // lanes)
        return knobs["tile_b"] * vectors_j * (knobs["tile_i"] + 1) + 1

    def default(self, info, fuse_epilogue=True):
        space = self.space(info)
        knobs = {k: v[0] for k, v in space.items()}
        knobs["epilogue"] = fuse_epilogue
        # about 256 accumulators (16 AVX-512 registers): 8 rows of a 32-wide tile (measured best
        # at 1024: 111 GFLOP/s, against 69 for 4 rows), as many rows as the registers hold with
        # the row of B and a broadcast: AVX2's 16 take 6 rows of 2 vectors (matmul 768^3 built
        # for znver3 on a Zen 4: 8 rows 121, 6 rows 226 GFLOP/s; 1024^3, 8 -> 4 rows: 110 -> 187)
        lanes = info.lanes(self.machine)
        vectors_j = max(1, knobs["tile_j"] // lanes)
        want = max(1, min(8, 256 // max(1, knobs["tile_j"])))
        regs = self.machine.vector_registers
        rows = [t for t in space["tile_i"] if self.registers({**knobs, "tile_i": t, "tile_b": 1}, lanes) <= regs]
        knobs["tile_i"] = min(rows or [min(space["tile_i"])], key=lambda t: (abs(t - want), -t))
        # steps of the reuse axis (a blocked conv's output-channel blocks) join the tile while
        # the accumulators, the vector operand's loads and a broadcast fit in the registers:
        # a 3x3 conv 32->32 at 56x56 on a Zen 5, 8 x 16 -> 2 x 8 x 16: 358 -> 453 GFLOP/s
        fits = [b for b in space["tile_b"] if self.registers({**knobs, "tile_b": b}, lanes) <= regs]
        knobs["tile_b"] = max(fits, default=1)
        # k is unrolled 4 times where one step of it is fewer than 16 vector FMAs: the loop's own
        # instructions (counter, compare, branch, pointer steps) beside them take a share of the
        # issue slots (AVX2's 6 x 2 tile: the inverted residual 3-5% slower at one step an
        # iteration). AVX-512's 8 x 2 tile keeps one step: the same speed (9 models within +-1.2%,
        # Zen 4), a quarter of the code and less of LLVM's time (matmul 512's kernel 43 -> 34 ms)
        fmas = knobs["tile_i"] * vectors_j * knobs["tile_b"]
        knobs["k_unroll"] = 1 if fmas >= 16 else 4
        # block k when a column panel of B (k x tile_j floats) no longer fits in L1: at
        # 1024^3 that took a matmul from 92 to 200 GFLOP/s, at 2048^3 from 55 to 166. The
        # chunk is the longest whose panel takes at most 1/32 of L2: each chunk reads and
        # writes all of C once more, and a panel streamed from L2 keeps the FMAs fed (AVX-512
        # Xeon, L2 2 MiB: 512 over 256 at 2048^3 322 -> 346, 1024^3 336 -> 354 GFLOP/s; with
        # 1 MiB or less of L2 the rule keeps 256, as measured before)
        elem = info.dtype_bits // 8
        panel = info.reduce[-1] * knobs["tile_j"] * elem
        chunks = [b for b in space["k_block"] if b >= 256 and b * knobs["tile_j"] * elem * 32 <= self.machine.l2_bytes]
        fallback = 256 if 256 in space["k_block"] else 0
        knobs["k_block"] = max(chunks, default=fallback) if panel > self.machine.l1_bytes else 0
        # block the rows too when a core's rows of A for one k chunk outgrow an eighth of L2
        # (B's panels pass through L2 as well): at 2048^3, 122 -> 182 GFLOP/s; 1024^3, 161 -> 182
        rows_a = math.ceil(info.spatial[-2] / self.machine.cores) * knobs["k_block"] * elem \
            if len(info.spatial) > 1 else 0
        knobs["i_block"] = max(space["i_block"]) if knobs["k_block"] and rows_a > self.machine.l2_bytes // 8 else 0
        return knobs

    def apply(self, builder, info, knobs):
        if not knobs["tile_j"]:
            raise ValueError("no vector tile for the innermost axis")
        name = info.name
        epilogue = self._epilogue(builder, name) if knobs["epilogue"] else None
        impl = builder.impl(name)
        spatial = [a.name for a in impl.axis if not a.reduce]
        reduce = [a.name for a in impl.axis if a.reduce]
        b_inner = []
        if knobs.get("tile_b", 1) > 1:  # the reuse axis goes last of the batch axes, split; its
            reuse = spatial[info.reuse_axis]  # inner part joins the register tile
            impl.reorder(*[a for a in spatial[:-2] if a != reuse], reuse)
            _, reuse_t = impl.tile_split(reuse, knobs["tile_b"])
            b_inner = [reuse_t]
            spatial = [a.name for a in impl.axis if not a.reduce and a.name != reuse_t]
        # the cores: a block split of the batch axes (merged) if they are enough, else of i
        batch, i_axis = spatial[:-2], (spatial[-2] if len(spatial) >= 2 else None)
        par = impl.merge_all(batch) if batch else None
        cores = self.machine.cores if info.size >= self.machine.parallel_min_elems else 1
        # without batch axes, i is split from two row tiles on, however many cores (fewer row tiles
        # than cores: a tile a core; a 66 x 128 x 96 matmul built for 16 cores had run on one)
        if par is not None and impl[par].size >= cores:
            block_axis = par
        else:
            rows = (cores if par is not None else 2) * knobs["tile_i"]
            block_axis = i_axis if i_axis is not None and impl[i_axis].size >= rows else par
        outer, blocked = ([par] if par is not None else []), None
        if block_axis is not None and cores > 1:
            size = impl[block_axis].size
            chunk = math.ceil(size / cores)
            if block_axis == i_axis:
                chunk = math.ceil(chunk / knobs["tile_i"]) * knobs["tile_i"]
            blocked, rest = impl.block_split(block_axis, chunk)
            if block_axis == i_axis:
                i_axis = rest
            else:
                outer = [blocked, rest]
        jT, jt = impl.tile_split(spatial[-1], knobs["tile_j"])
        if blocked is None and par is None and i_axis is None and self.machine.cores > 1 and \
                impl[jT].size >= self.machine.cores and \
                info.size * math.prod(info.reduce) >= self.machine.parallel_min_elems:
            # one row of output (a column sum, x.mean(0)): its tiles across the cores, by the
            # work (rows x columns), not by the output's size. Kernels alone, Zen 4: x.mean(0) of
            # 4096 x 512 0.188 -> 0.117 ms (znver3 0.238 -> 0.142; eager 0.139)
            blocked, jT = impl.block_split(jT, math.ceil(impl[jT].size / self.machine.cores))
        inner = [jt]
        i_outer = []
        if i_axis is not None:
            if knobs["tile_i"] > 1 and impl[i_axis].size % knobs["tile_i"] == 0 and impl[i_axis].size > knobs["tile_i"]:
                iT, it = impl.tile_split(i_axis, knobs["tile_i"])
                i_outer, inner = [iT], [it, jt]
            elif knobs["tile_i"] > 1 and impl[i_axis].size == knobs["tile_i"]:
                inner = [i_axis, jt]  # the whole axis is the tile's rows
            else:
                i_outer = [i_axis]
        inner = b_inner + inner
        k_chunks = []
        k_block = knobs.get("k_block", 0)
        if k_block and impl[reduce[-1]].size > k_block and impl[reduce[-1]].size % k_block == 0:
            kC, kc = impl.tile_split(reduce[-1], k_block)
            k_chunks, reduce = [kC], reduce[:-1] + [kc]
        k_inner = []
        if knobs["k_unroll"] > 1 and impl[reduce[-1]].size % knobs["k_unroll"] == 0 and impl[reduce[-1]].size > knobs["k_unroll"]:
            kT, kt = impl.tile_split(reduce[-1], knobs["k_unroll"])
            reduce = reduce[:-1] + [kT]
            k_inner = [kt]
        lead = ([blocked] if blocked is not None and blocked not in outer else []) + outer
        placed = [name]
        if k_chunks:
            i_block = knobs.get("i_block", 0) // max(1, knobs["tile_i"])  # in i tiles
            if i_block > 1 and i_outer and impl[i_outer[0]].size > i_block and impl[i_outer[0]].size % i_block == 0:
                iB, iTt = impl.tile_split(i_outer[0], i_block)
                impl.reorder(*lead, *k_chunks, iB, jT, iTt, *reduce, *k_inner, *inner)
            else:
                impl.reorder(*lead, *k_chunks, jT, *i_outer, *reduce, *k_inner, *inner)
            if epilogue is not None and lead:
                builder.reverse_compute_at(epilogue, name, lead[-1])
                epi = builder.impl(epilogue)
                own = epi.names[len(lead):]
                self.vectorize_tail(builder, epilogue, epi.merge_all(own), self.lanes_of(builder, epilogue))
                builder.groups[epilogue].role = "epilogue per block of rows"
                placed.append(epilogue)
        else:
            impl.reorder(*lead, *i_outer, jT, *reduce, *k_inner, *inner)
            tail = epilogue if epilogue is not None else builder.cache_write(name)
            builder.reverse_compute_at(tail, name, jT)
            relaid = self._relaid_epilogue(builder, name, jT, tail) \
                if epilogue is None and knobs["epilogue"] else None
            if relaid is None:
                tail_impl = builder.impl(tail)
                tail_impl.mark_vectorized(tail_impl.names[-1])
                builder.groups[tail].role = "epilogue on the tile" if epilogue is not None else "write-back of the tile"
            placed.append(relaid or tail)
        impl.mark_vectorized(jt)
        for unrolled in inner[:-1]:
            impl.mark_unrolled(unrolled)
        for kt in k_inner:
            impl.mark_unrolled(kt)
        if blocked is not None:
            impl.mark_parallel(blocked)
            if knobs.get("stage"):
                placed += self._stages_per_core(builder, name, blocked)
        builder.decompose_reduction(name, (k_chunks or reduce)[0], flat_init=impl[jt].size if k_chunks else 0)
        builder.groups[name].role = "register tile"
        return placed

    def _stages_per_core(self, builder: ScheduleBuilder, name: str, blocked: str) -> list[str]:
        """Compute each input stage of the anchor (a spatial block at the root that only the
        anchor reads: a convolution's padding, with a layout change) inside the loop over the
        cores, where no more than ``STAGE_REDUNDANCY`` times the stage is computed in all.
        Scheduled alone, the stage is split over the cores by its outer axis (the channel
        blocks), so each core's tiles read half their input from the other core's cache. The
        ResNet basic block (1x32x56x56, two 3x3 convs), Zen 4: 0.563-0.567 -> 0.538-0.542 ms
        (interleaved, 4.0-4.4%); conv-bn-relu 1-3%; both built for znver3, within +-0.5%."""
        moved = []
        shared = builder.impl(name).index(blocked) + 1  # the stage's loops from here on are its own
        for stage in input_stages(builder.sch, prim.get_sblock(builder.sch, name), set(builder.block_names())):
            total = math.prod(int(iv.dom.extent) for iv in builder.block(stage).iter_vars)
            trial = builder.copy()
            trial.compute_at(stage, name, blocked)
            per_core = math.prod(a.size for a in trial.impl(stage).axis[shared:])
            if per_core * builder.impl(name)[blocked].size > self.STAGE_REDUNDANCY * total:
                continue
            builder.compute_at(stage, name, blocked)
            own = builder.impl(stage).names[shared:]
            if own:
                self.vectorize_tail(builder, stage, own[-1], self.lanes_of(builder, stage))
            builder.groups[stage].role = "input stage per core"
            builder.groups[stage].moved = True
            moved.append(stage)
        return moved

    def _relaid_epilogue(self, builder: ScheduleBuilder, name: str, axis: str, copy: str) -> str | None:
        """The consumer of the tile's write-back ``copy``, moved onto the tile (under ``axis``) and
        reading the tile itself, where it walks the output in another layout: a blocked
        convolution's epilogue that writes NCHW (BatchNorm, ReLU, the residual, the layout back).
        At the root it read the whole NCHWc result back, across its channel blocks, after the
        convolution had written it out. None when TVM cannot place it, or placed it would compute
        an element more than once. conv 3x3 64->64 + BN + ReLU + residual, 8x64x56x56, Zen 4:
        kernel 9.2-9.5 -> 8.6-9.0 ms."""
        consumers = prim.get_consumers(builder.sch, prim.get_sblock(builder.sch, copy))
        if len(consumers) != 1:
            return None
        block = stmt(builder.sch, consumers[0])
        if any(int(iv.iter_type) != 0 for iv in block.iter_vars):
            return None
        consumer, elements = block.name_hint, math.prod(int(iv.dom.extent) for iv in block.iter_vars)
        for attempt in (builder.copy(), builder):  # the trial first: a failure leaves builder as it was
            try:
                attempt.reverse_compute_at(consumer, name, axis)
                if attempt.runs(consumer) != elements:
                    return None
                attempt.compute_inline(copy)
            except (s_tir.ScheduleError, tvm.error.InternalError, RuntimeError, TypeError):
                # TypeError: a loop TVM made with an extent that is not a constant (the
                # consumer's region depends on the tile's place: a transposed convolution's)
                if attempt is builder:
                    raise
                return None
        self.vectorize_tail(builder, consumer, builder.impl(consumer).names[-1], self.lanes_of(builder, consumer))
        builder.groups[consumer].role = "epilogue on the tile, in its own layout"
        return consumer

    @staticmethod
    def _epilogue(builder: ScheduleBuilder, name: str) -> str | None:
        consumers = prim.get_consumers(builder.sch, prim.get_sblock(builder.sch, name))
        if len(consumers) != 1:
            return None
        epi = stmt(builder.sch, consumers[0])
        anchor_ext = [int(iv.dom.extent) for iv in builder.block(name).iter_vars if int(iv.iter_type) == 0]
        if any(int(iv.iter_type) != 0 for iv in epi.iter_vars) or [int(iv.dom.extent) for iv in epi.iter_vars] != anchor_ext:
            return None
        return epi.name_hint


# ---------------------------------------------------------------------- multi-stage
def lane_digits(impl: ImplGraph, lane: str) -> list[str]:
    """Split axis ``lane`` (a vector's lanes, a power of two of them) into axes of 2, its binary
    digits, most significant first; ``[lane]`` for another count or fewer than 4."""
    size = impl[lane].size
    if size < 4 or size & (size - 1):
        return [lane]
    digits = []
    while impl[lane].size > 2:
        high, lane = impl.tile_split(lane, impl[lane].size // 2)
        digits.append(high)
    return digits + [lane]


class PersistentRows(Policy):
    """A normalization kernel (softmax, layer norm ...): every stage of one row under one
    loop, the row reductions keeping vector partial sums, the rows across the cores. The
    row is read from memory once and stays in cache between stages. A full-size stage the
    output reads element-wise (softmax's exp) is written into the output, and its partial
    sums are taken in its own loop. Knobs: ``prefetch``, the busiest loop over the row also
    fetches the next row of the inputs, so memory works while this row's arithmetic runs;
    ``accumulators``, vectors of partial sums per reduction of an input (independent chains
    of adds instead of one; combined as vectors, then across the lanes). The lanes are summed
    in halves (16 -> 8 -> 4 -> 2 -> 1), four dependent adds at the row's end instead of 16:
    on a Zen 4 (per-round ratios, same process) softmax 3-4%, log_softmax 2-3%, LayerNorm
    1-2%, LayerNorm by hand 5-8% faster, RMSNorm within the noise; built for znver3 there,
    LayerNorm by hand 5%, the others within +-2%. 11-14 ms more compile time a kernel."""

    name = "persistent_rows"
    KNOBS = ("vector", "prefetch", "accumulators")
    # the arithmetic operations an element of the output pass from which its arithmetic, not its
    # memory traffic, bounds it: an exp takes 15 or more (``fast_math``); LayerNorm's affine, 8
    WIDE_ROW_OPS = 16
    whole_kernel = True

    def applies(self, info, builder):
        return self.rows(builder) is not None

    def space(self, info):
        lanes = info.lanes(self.machine)
        return {"vector": [lanes, lanes // 2] if lanes >= 8 else [lanes], "prefetch": [1, 0],
                "accumulators": [4, 1]}

    def rows(self, builder: ScheduleBuilder, infos: list[BlockInfo] | None = None
             ) -> tuple[int, tuple[int, int] | None] | None:
        """How many leading axes every stage shares (None if this form does not fit), and the
        output axis split into (groups, per group), as (axis, per), where the statistics come
        from a grouped view of it: a group norm's (N, G, C/G, H, W) against its output's
        (N, C, H, W), whose rows are then (n, g), C/G x H x W contiguous elements each."""
        infos = infos or builder.infos()
        reductions = [i for i in infos if i.reduce]
        if len(infos) < 2 or not reductions or any(i.kind == "anchor" for i in infos):
            return None
        out_shape = [int(d) for d in builder.block(infos[-1].name).writes[0].source.shape]
        shapes = [self._padded([int(d) for d in builder.block(r.name).writes[0].source.shape], out_shape)
                  for r in reductions]
        split = None
        grouped = next((s for s in shapes if len(s) == len(out_shape) + 1), None)
        if grouped is not None:
            d = next((d for d, (s, o) in enumerate(zip(grouped, out_shape)) if s != o), len(out_shape))
            if d == len(out_shape) or out_shape[d] % grouped[d] or grouped[d + 1] != 1:
                return None
            split = (d, out_shape[d] // grouped[d])
            out_shape = out_shape[:d] + [grouped[d], split[1]] + out_shape[d + 1:]
        rows = len(out_shape)
        for shape in shapes:
            if len(shape) != len(out_shape):
                return None
            rows = min(rows, next((d for d, (s, o) in enumerate(zip(shape, out_shape)) if s != o), len(shape)))
        if split is not None and rows <= split[0]:  # the groups must be among the rows
            return None
        if any(d != 1 for shape in shapes for d in shape[rows:]):
            # a reduction that makes a whole row, not one statistic of it: the scores q @ k^T
            # under attention's softmax. Its lanes would span the row (vectors of 512 floats for
            # 64 x 64 scores, on which LLVM spent 48 s)
            return None
        return (rows, split) if 0 < rows < len(out_shape) else None

    @staticmethod
    def _padded(shape: list[int], out_shape: list[int]) -> list[int]:
        """A statistic's shape with fewer axes than the output, as a norm written by hand over a
        reshaped view leaves it (``x.reshape(N, G, -1).mean(-1, keepdim=True)``: (N, G, 1) for an
        (N, C, H, W) output), in the output's terms: the axes it shares with the output, then
        1s; where its last kept axis divides the output's (G of C), the grouped form (N, G, 1,
        1, 1). It must keep the output's first axis (a statistic of each row, not of each
        column); any other shape is returned as it is."""
        if len(shape) >= len(out_shape):
            return shape
        d = next((d for d, (s, o) in enumerate(zip(shape, out_shape)) if s != o), len(shape))
        if d == 0 or any(s != 1 for s in shape[d + 1:]):
            return shape
        if d == len(shape) or shape[d] == 1:  # (N, C) or (N, C, 1) of (N, C, H, W)
            return shape[:d] + [1] * (len(out_shape) - d)
        if out_shape[d] % shape[d]:
            return shape
        return shape[:d + 1] + [1] * (len(out_shape) - d)

    def apply(self, builder, info, knobs):
        infos = builder.infos()
        rows, split = self.rows(builder, infos)
        names = builder.block_names()
        flat = {i.name: i.flat_reduce for i in infos}
        vector = knobs["vector"]
        staged = {builder.block(n).writes[0].source.name for n in names[:-1]
                  if not any(a.reduce for a in builder.impl(n).axis)}
        partials, combines, halves = {}, {}, {}
        lane_axes = {}  # block -> how many of its last axes are binary digits of the lane
        for name in names[:-1]:  # vector partial sums first: rfactor wants a root loop nest
            impl = builder.impl(name)
            reduce = [a.name for a in impl.axis if a.reduce]
            if len(reduce) > 1 and flat[name]:  # one contiguous run: a group's C/G x H x W
                reduce = [impl.merge_all(reduce)]
            k = impl[reduce[-1]] if reduce else None
            factor = vector_factor(k.size, vector) if reduce else 0
            if factor and k.size >= 2 * vector:
                # several vectors of partial sums break the chain of dependent adds; not for a
                # reduction of a stage, whose sums go into the stage's loop one vector at a time
                reads_stage = any(r.source.name in staged for r in builder.block(name).reads)
                acc = 1 if reads_stage else RowPerCore.chains(k.size // factor, knobs.get("accumulators", 1))
                kT, kt = impl.tile_split(k.name, factor)
                if acc > 1:
                    impl.tile_split(kT, acc)
                digits = lane_digits(impl, kt)
                # one rfactor per binary digit of the lane, the last first: each block it leaves
                # adds the two halves of the lanes the one before it made, the row's reduction
                # the last two; the first made is the vector of partial sums
                positions = [impl.index(d) for d in digits]
                top, made = name, []
                for pos in reversed(positions):
                    top = builder.rfactor(top, builder.impl(top).names[pos], factor_axis=0)
                    made.append(top)
                partials[name] = made[-1]
                halves[name] = made[-2::-1]  # producer first
                for step, n in zip(halves[name], range(len(digits) - 1, 0, -1)):
                    lane_axes[step] = n
                    builder.groups[step].role = "lane halves"
                lane_axes[made[-1]] = len(digits)
                builder.groups[name].role = "row reduction"
                if acc > 1:  # its acc vectors: the lanes' sums in acc independent chains
                    combines[name] = partials[name]
                    rf = builder.impl(combines[name])
                    partials[name] = builder.rfactor(combines[name], [a.name for a in rf.axis if a.reduce][-1],
                                                     factor_axis=0)
                    lane_axes[partials[name]] = len(digits)
                    builder.groups[combines[name]].role = "vector combine"
        out = names[-1]
        impl = builder.impl(out)
        own = 1  # the output's axes from which the columns are merged
        if split is not None:  # (..., C, ...) -> (..., G, C/G, ...): the rows are the groups
            impl.tile_split(impl.names[split[0]], split[1])
            # a group's channels stay an axis of their own: a vector across two channels would
            # gather their scale and shift (GroupNorm + SiLU 4x48x30x30: 0.117 ms, against 0.040)
            if rows == split[0] + 1 and len(impl.names) > rows + 1:
                own = 2
        row = impl.merge_all(impl.names[:rows])
        builder.groups[out].role = "output row"
        cols = impl.merge_all(impl.names[own:]) if len(impl.names) > own + 1 else impl.names[own]
        row_len = impl[cols].size
        # a channel's pass runs as keep_2d runs a pointwise row: two vectors an iteration where
        # they divide it, two exps in flight (GroupNorm + SiLU on a Zen 4, 4x48x32x32 and
        # 2x64x64x64: 8% faster than one vector; built for AVX2 there, 17%)
        # A row no whole vector divides (a LayerNorm over 900) takes row_vector's wide vector
        # where the output's arithmetic bounds it (an exp: 29-80 operations an element; 900 with
        # GELU: 4 lanes 0.32 ms, 30 lanes 0.145, Zen 4, 256 rows; with SiLU 0.148 -> 0.073; built
        # for znver3, 15 lanes, 0.65-0.67x and 0.78-0.84x), vector_factor's narrow one where memory does
        # (LayerNorm or RMSNorm alone, 5-8 operations: 30 lanes 1.02-1.05x slower, 15 1.17-1.20x)
        wide = own > 1 or (row_len % vector and arithmetic_ops(builder.block(out).body) >= self.WIDE_ROW_OPS)
        width = row_vector(row_len, vector) if wide else vector_factor(row_len, vector)
        outer = self.vectorize_tail(builder, out, cols, width)
        if own > 1 and outer is not None and outer != cols and width % vector:
            # a vector of no whole number of registers: (channel, vector) become one loop. Under
            # a loop of their own LLVM hoists the channel's scale and shift, split in pieces, and
            # spills them (AVX2's 15 lanes of 900: 91 instructions an iteration against 80)
            impl.merge(impl.names[1], outer)
        order = [m for n in names[:-1] for m in [partials.get(n), combines.get(n), *halves.get(n, []), n] if m]
        runs = {name: builder.runs(name) for name in order}
        for name in reversed(order):
            builder.compute_at(name, out, row)
        for name in order:
            # a stage whose row is not the output's (a statistic of channels c % G read against
            # groups of c // (C/G)) would be computed whole under every row: 22x the time
            if builder.runs(name) != runs[name]:
                raise ValueError(f"{name}: under the output's rows it would run more than once")
        stage_loops = {}  # row stage -> its loop over vectors of the row
        halving = {step for steps in halves.values() for step in steps}
        for name in order:
            impl = builder.impl(name)
            own = impl.names[1:]
            if name in lane_axes:
                # the loops it reduces outside, then (accumulator,) lane: the lane, its binary
                # digits merged again, vectorized
                reduce = [n for n in own if impl[n].reduce]
                spatial = [n for n in own if not impl[n].reduce]
                digits = spatial[len(spatial) - lane_axes[name]:]
                impl.reorder(*reduce, *spatial)
                for n in spatial[:len(spatial) - len(digits)] + (reduce if name in halving else []):
                    impl.mark_unrolled(n)
                impl.mark_vectorized(impl.merge_all(digits))
                if name in partials.values():
                    builder.groups[name].role = "vector partial sums"
            elif not any(impl[n].reduce for n in own) and own:
                tail = impl.merge_all(own) if len(own) > 1 else own[0]
                outer = self.vectorize_tail(builder, name, tail, vector_factor(impl[tail].size, vector))
                if outer is not None and outer != tail:
                    stage_loops[name] = outer
                builder.groups[name].role = builder.groups[name].role or "row stage"
        for partial in partials.values():  # sum a stage's vectors as it makes them
            self._into_stage_loop(builder, partial, stage_loops, lane_axes[partial])
        into = next((name for name in reversed(names[:-1]) if builder.write_into_output(name)), None)
        if into is not None:  # a full-size stage the output row reads element-wise
            builder.groups[into].role = "row stage, in the output"
        if info.size >= self.machine.parallel_min_elems and self.machine.cores > 1:
            builder.impl(out).mark_parallel(row)
        row_bytes = math.prod(a.size for a in builder.impl(out).axis[1:]) * \
            tvm.DataType(str(builder.block(out).writes[0].source.dtype)).bits // 8
        # the next row is fetched beside this one: both must fit in L1, or the prefetches evict
        # the row being worked on (GroupNorm's groups of 21-160 KiB ran 5-15% slower with them)
        if knobs.get("prefetch") and 2 * row_bytes <= self.machine.l1_bytes:
            host = self._busiest_row_loop(builder, out, stage_loops, partials.values())
            if host is not None:
                builder.prefetch_next_row(*host, (out, row), builder.impl(out)[row].size)
        return names + list(partials.values()) + list(combines.values())

    @staticmethod
    def _busiest_row_loop(builder: ScheduleBuilder, out: str, stage_loops: dict[str, str],
                          partials) -> tuple[str, str] | None:
        """The (block, axis) of the loop over a row's vectors with the most arithmetic in its
        body: the prefetches of the next row spread over the longest work."""
        loops = dict(stage_loops)
        for name in [*partials, out]:
            impl = builder.impl(name)
            if name not in loops and len(impl.names) > 2 and impl.names[1] not in builder.impl(out).names[:1]:
                loops[name] = impl.names[1]
        if not loops:
            return None
        work = {name: arithmetic_ops(builder.block(name).body) for name in loops}
        for name in partials:  # a partial sum moved into a stage's loop works there
            owner = next((s for s, axis in stage_loops.items() if axis in builder.impl(name).names), None)
            if owner is not None:
                work[owner] += work.pop(name, 0)
        best = max(work, key=work.get)
        return best, loops[best]

    @staticmethod
    def _into_stage_loop(builder: ScheduleBuilder, partial: str, stage_loops: dict[str, str], digits: int) -> None:
        """Move a partial-sum block into the loop of the row stage it reads, when that loop
        makes exactly one vector of partial sums per iteration (its lane: its last ``digits``
        axes, merged)."""
        reads = {r.source.name for r in builder.block(partial).reads}
        lanes = next(builder.impl(partial)[n].size for n in builder.impl(partial).names[1:]
                     if not builder.impl(partial)[n].reduce)
        for stage, axis in stage_loops.items():
            written = builder.block(stage).writes[0].source.name
            impl = builder.impl(stage)
            if written not in reads or impl.axis[-1].size != lanes:
                continue
            builder.reverse_compute_at(partial, stage, axis)
            moved = builder.impl(partial)
            moved.mark_vectorized(moved.merge_all(moved.names[-digits:]))
            builder.groups[partial].role = "vector partial sums, in the stage loop"
            return


POLICIES = (PersistentRows, RegisterTiledAnchor, RowPerCore, SplitReduction, ReadTile, TransposeTile, Keep2D,
            MergeAllBlockVectorize, ParallelOnly)
