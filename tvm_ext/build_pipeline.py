"""What ``tvm.compile`` runs on our lowered module: TVM's default Relax VM pipeline with
PlanMemory in place of StaticPlanBlockMemory, and TVM's TIR pipeline with kernels that
accept unaligned arguments (so that numpy arrays, 16-byte aligned, go in without a copy)."""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.tirx import compilation_pipeline

from relay_passes.plan_memory import PlanMemory

TIR_PIPELINE = "tvm_ext"


def before_planning() -> list[tvm.transform.Pass]:
    """The VM lowering up to memory planning: every kernel call in destination-passing style."""
    t = relax.transform
    return [relax.backend.DispatchSampling(), relax.backend.DispatchSortScan(), t.LegalizeOps(),
            t.RewriteDataflowReshape(), t.ToNonDataflow(), t.RemovePurityChecking(), t.CallTIRRewrite()]


def relax_pipeline(plan: PlanMemory) -> tvm.transform.Pass:
    """TVM 0.27's ``default_build_pipeline``, with ``plan`` where StaticPlanBlockMemory was."""
    t = relax.transform
    return tvm.transform.Sequential([
        *before_planning(), plan, t.RewriteCUDAGraph(), t.LowerAllocTensor(), t.KillAfterLastUse(),
        t.LowerRuntimeBuiltin(), t.ComputePrimValue(), t.VMShapeLower(), t.AttachGlobalSymbol()],
        name="tvm_ext.relax_pipeline")


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


def _tir_pipeline():
    passes, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("s_tir")
    return tvm.transform.Sequential([passes, accept_unaligned_arguments]), finalize_host, finalize_device


compilation_pipeline.register_tir_pipeline(TIR_PIPELINE, _tir_pipeline)
