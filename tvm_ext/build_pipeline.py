"""What ``tvm.compile`` runs on our lowered module: TVM's default Relax VM pipeline with
PlanMemory in place of StaticPlanBlockMemory, and our TIR pipeline (``tvm_ext.tir_pipeline``)."""
from __future__ import annotations

import tvm
from tvm import relax

from relay_passes.plan_memory import PlanMemory
from tvm_ext.tir_pipeline import TIR_PIPELINE

__all__ = ["TIR_PIPELINE", "before_planning", "relax_pipeline"]


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
