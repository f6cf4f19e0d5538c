"""The TIR pipeline every kernel of ours is built with, by the compiler and by the tuner's
builder alike: TVM 0.27's ``s_tir`` pipeline with three changes.

- ``RejoinMergedIndices`` between FlattenBuffer and VectorizeLoop. A loop over merged axes
  (``merge_all`` on a 4x48x30x30 tensor: 32 lanes across rows of 30) indexes each buffer by
  the axes' div/mod pieces, which the simplifier has already rewritten one axis at a time;
  flattened, they add up to the merged index again, but TVM's simplifier no longer sees it.
  VectorizeLoop then finds a non-affine index and scalarizes every load and store (``x + 1``
  there: 109 us, numpy 22 us, on an AVX-512 Xeon).
- Kernel arguments marked aligned to their element, not 64 bytes (``AcceptUnalignedArguments``),
  so that numpy arrays go in without a copy.
- Buffers of up to ``STACK_BYTES`` on the stack (``StackSmallBuffers``, on a CPU). TVM gives
  the stack only what is under 1 KiB and allocates the rest from its workspace pool; a
  register tile of 16 zmm vectors is exactly 1 KiB. From the pool, the tile's stores cannot
  be removed (the pointer escapes to the free call): LLVM kept the accumulators in registers
  and still zeroed the tile in memory before each tile and stored it after, 32 stores
  queued behind the tile's write-back. On the stack, LLVM's SROA removes the buffer. Kernel
  alone, Zen 4: conv-bn-relu 0.93-0.96x, the inverted residual's convolutions 0.85-0.91x,
  the attention's two kernels 0.92 and 0.96x, the transformer's QKV and FFN kernels
  0.96-0.99x; the ResNet block's convolutions, mlp's GEMMs and the memory-bound kernels
  within +-2%.

And for a module whose kernels all run on the CPU, three GPU passes are left out (``GPU_ONLY``).
InjectPermutedLayout rewrites the shared-memory layout of tensor-core blocks and
InjectVirtualThread expands ``vthread`` bindings; neither exists on a CPU. RenormalizeSplitPattern
rewrites thread-index arithmetic; without it the lowered kernels of all 18 benchmark models are
the same, statement for statement, on two cores. Where it does change a CPU kernel, it divides a
guard by a common factor (built for 16 cores: ``a * 338 + b < 5400`` -> ``a * 169 + b // 2 <
2700``), a division more. On a kernel that holds erf or tanh (an exp nested in a
``Let``), each of the three took 20-33 ms, where each took 0.1-0.5 ms on the others: a GELU
after a matmul's tile had 146 ms of TIR passes, 82 of them these three (Zen 4).
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.pipeline import finalize_device_passes, finalize_host_passes
from tvm.tirx import compilation_pipeline

from tvm_ext.report import buffer_bytes

TIR_PIPELINE = "tvm_ext"


def _element_aligned(stmt: tirx.AttrStmt) -> tirx.AttrStmt:
    if stmt.attr_key != "storage_alignment":
        return stmt
    ptr = getattr(stmt.node, "type_annotation", None)
    elem = getattr(ptr, "element_type", None)
    dtype = getattr(elem, "dtype", None)
    align = max(1, tvm.DataType(str(dtype)).bits // 8) if dtype is not None else 1
    return tirx.AttrStmt(stmt.node, stmt.attr_key, tirx.IntImm("int32", align), stmt.body)


@tvm.transform.module_pass(opt_level=0, name="AcceptUnalignedArguments")
def accept_unaligned_arguments(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """MakePackedAPI marks every tensor argument 64-byte aligned, and LLVM then emits aligned
    vector moves that fault on a numpy array (16-byte aligned). Mark arguments aligned to their
    element instead: the same instructions' unaligned forms, no slower on aligned data."""
    funcs = {gv: tvm_ffi.structural_map(f, (tirx.AttrStmt, _element_aligned)) if isinstance(f, tirx.PrimFunc) else f
             for gv, f in mod.functions_items()}
    return tvm.IRModule(funcs, attrs=mod.attrs)


def _sum_terms(e: tirx.PrimExpr, sign: int, out: list) -> list:
    if isinstance(e, tirx.Add):
        _sum_terms(e.a, sign, out)
        _sum_terms(e.b, sign, out)
    elif isinstance(e, tirx.Sub):
        _sum_terms(e.a, sign, out)
        _sum_terms(e.b, -sign, out)
    else:
        out.append((sign, e))
    return out


def _div_times(e: tirx.PrimExpr) -> tuple[tirx.PrimExpr, int] | None:
    """(a, c) when ``e`` is ``floordiv(a, c) * c``."""
    if isinstance(e, tirx.Mul):
        for d, k in ((e.a, e.b), (e.b, e.a)):
            if (isinstance(d, tirx.FloorDiv) and isinstance(k, tirx.IntImm) and isinstance(d.b, tirx.IntImm)
                    and d.b.value == k.value):
                return d.a, k.value
    return None


def _mods_expanded(e: tirx.PrimExpr) -> tirx.PrimExpr:
    """``e`` with every ``x % c`` written ``x - x // c * c``, which the simplifier can cancel."""
    if isinstance(e, tirx.FloorMod):
        x = _mods_expanded(e.a)
        return x - tirx.floordiv(x, e.b) * e.b
    if isinstance(e, (tirx.Add, tirx.Sub, tirx.Mul)):
        return type(e)(_mods_expanded(e.a), _mods_expanded(e.b))
    return e


def rejoin_index(e: tirx.PrimExpr, analyzer: "tvm.sym.Analyzer") -> tirx.PrimExpr:
    """``e`` with each pair of terms ``a // c * c + b % c`` replaced by ``a``, where ``a - b`` is
    provably a multiple of c (then ``a % c == b % c``, and the pair is ``a - a % c + a % c``)."""
    terms = _sum_terms(e, 1, [])
    if not any(isinstance(t, tirx.FloorMod) for _, t in terms):
        return e
    joined = True
    while joined:
        joined = False
        for i, (si, ti) in enumerate(terms):
            pair = _div_times(ti) if si > 0 else None
            if pair is None:
                continue
            a, c = pair
            for j, (sj, tj) in enumerate(terms):
                if (sj > 0 and isinstance(tj, tirx.FloorMod) and isinstance(tj.b, tirx.IntImm) and tj.b.value == c
                        and analyzer.can_prove(tirx.floormod(analyzer.simplify(_mods_expanded(a - tj.a)), c) == 0)):
                    terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [(1, a)]
                    joined = True
                    break
            if joined:
                break
    out = None
    for sign, t in terms:
        out = (t if sign > 0 else -t) if out is None else (out + t if sign > 0 else out - t)
    return analyzer.simplify(out)


@tirx.transform.prim_func_pass(opt_level=0, name="RejoinMergedIndices")
def rejoin_merged_indices(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:
    """Flat buffer indices of merged loops rejoined into one affine term (see the module's note)."""
    analyzer = tvm.sym.Analyzer()

    tvm_ffi.structural_walk(func.body, (tirx.For, lambda loop: analyzer.bind(
        loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))))

    def store(node: tirx.BufferStore) -> tirx.BufferStore:
        indices = [rejoin_index(i, analyzer) for i in node.indices]
        if all(a.same_as(b) for a, b in zip(indices, node.indices)):
            return node
        return tirx.BufferStore(node.buffer, node.value, indices)

    def load(node: tvm.ir.TensorLoad) -> tvm.ir.TensorLoad:
        indices = [rejoin_index(i, analyzer) for i in node.indices]
        if all(a.same_as(b) for a, b in zip(indices, node.indices)):
            return node
        return tirx.BufferLoad(node.source, indices)

    return tvm_ffi.structural_map(func, [(tirx.BufferStore, store), (tvm.ir.TensorLoad, load)])


#: the largest buffer a CPU kernel keeps on its stack (TVM's own limit: under 1 KiB). 16 KiB
#: holds every register tile and per-core row buffer of the benchmark's kernels (1-8 KiB);
#: a thread of TVM's pool has the system's 8 MiB stack
STACK_BYTES = 16 * 1024


@tirx.transform.prim_func_pass(opt_level=0, name="StackSmallBuffers")
def stack_small_buffers(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:
    """Every global buffer of a constant size up to ``STACK_BYTES`` marked for the stack, where
    LowerTVMBuiltin would otherwise allocate it from the workspace pool (see the module's note)."""
    def allocation(node: tirx.AllocBuffer) -> tirx.AllocBuffer:
        nbytes = buffer_bytes(node.buffer)
        if node.buffer.scope() != "global" or nbytes is None or nbytes > STACK_BYTES:
            return node
        stack = {**(node.annotations or {}), "disable_lower_builtin": tirx.IntImm("bool", 1)}
        return tirx.AllocBuffer(node.buffer, stack)

    return tvm_ffi.structural_map(func, [(tirx.AllocBuffer, allocation)])


#: passes that act only on GPU constructs, left out for kernels that all run on a CPU
GPU_ONLY = frozenset(["s_tir.InjectPermutedLayout", "s_tir.InjectVirtualThread", "s_tir.RenormalizeSplitPattern"])


def lowering_passes(config: dict, cpu_only: bool = False) -> list[tvm.transform.Pass]:
    """``tvm.s_tir.pipeline.default_s_tir_pipeline``'s passes, in its order, reading the same
    PassContext options, with the simplification after flattening. When every kernel runs on a
    CPU (``cpu_only``), ``GPU_ONLY`` is left out and small buffers go on the stack."""
    st, tx = s_tir.transform, tirx.transform
    passes = [
        st.CanonicalizeLoop(), st.LowerCrossThreadReduction(), st.LowerInitBlock(),
        st.PlanAndUpdateBufferAllocationLocation(), st.ConvertBlocksToOpaque(), st.LiftThreadBinding(),
        st.ManifestSharedMemoryLocalStage(), st.CompactBufferAllocation(), st.LowerAutoCopy(),
        st.UnifyThreadBinding(), st.LowerMatchBuffer(), st.StmtSimplify(), st.InjectPermutedLayout(),
        st.AnnotateIrregularLoop(), st.InjectSoftwarePipeline(), st.TransformMmaBufferLayout(),
        st.LowerOpaqueBlock(), tx.FlattenBuffer(),
        rejoin_merged_indices,
        tx.BF16ComputeLegalize(), tx.NarrowDataType(32), st.LoopPartition(),
        tx.VectorizeLoop(not bool(config.get("tirx.disable_vectorize", False))),
        st.InjectVirtualThread(), st.InjectDoubleBuffer(),
    ]
    if not bool(config.get("tirx.disable_storage_rewrite", False)):
        passes.append(tx.StorageRewrite())
    if config.get("tirx.use_async_copy", False):
        passes.append(st.LowerAsyncDMA())
    passes += [st.HoistIfThenElse(), tx.UnrollLoop(), st.RenormalizeSplitPattern(), tx.StmtSimplify(),
               tx.RemoveNoOp(), st.RewriteUnsafeSelect()]
    if bool(config.get("tirx.instrument_bound_checkers", False)):
        passes.append(st.InstrumentBoundCheckers())
    if bool(config.get("tirx.s_tir.ldg32", False)):
        passes.append(st.InjectPTXLDG32(True))
    if not bool(config.get("tirx.disable_cse_tir", False)):
        passes.append(tx.CommonSubexprElim())
    if bool(config.get("tirx.instrument_lwp", False)):
        passes.append(st.InstrumentProfileIntrinsics())
    passes += [tx.FP8ComputeLegalize(), st.VerifyVTCMLimit(), st.LowerVtcmAlloc(), tx.VerifyMemory(),
               tx.AnnotateEntryFunc(), st.ThreadSync("shared"), st.ThreadSync("shared.dyn"),
               st.ThreadSync("warp"), st.InferFragment(), st.LowerThreadAllreduce()]
    if bool(config.get("tirx.use_async_copy", False)):
        passes.append(st.InjectPTXAsyncCopy())
    if bool(config.get("tirx.s_tir.ldg32", False)):
        passes.append(st.InjectPTXLDG32())
    passes += [st.MergeSharedMemoryAllocations(), tx.SplitHostDevice(), tx.MakePackedAPI(),
               tx.FP8StorageLegalize(), tx.BF16StorageLegalize(), accept_unaligned_arguments]
    if not cpu_only:
        return passes
    return [p for p in passes if p.info.name not in GPU_ONLY] + [stack_small_buffers]


def _runs_on_cpu(mod: tvm.IRModule) -> bool:
    """Whether every kernel of ``mod`` is bound to a CPU target (BindTarget runs first), by the
    target's device type, as ``tvm.tirx.build`` tells host from device."""
    targets = [f.attrs.get("target") if f.attrs is not None else None
               for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    return bool(targets) and all(t is not None and t.get_target_device_type() == tvm_ffi.DLDeviceType.kDLCPU
                                 for t in targets)


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.tir_pipeline")
def _lower(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    config = tvm.transform.PassContext.current().config
    return tvm.transform.Sequential(lowering_passes(config, _runs_on_cpu(mod)))(mod)


def _tir_pipeline():
    return _lower, finalize_host_passes, finalize_device_passes


compilation_pipeline.register_tir_pipeline(TIR_PIPELINE, _tir_pipeline)
