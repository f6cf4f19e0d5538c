"""What ``tvm.compile`` runs on our lowered module: TVM's default Relax VM pipeline with
PlanMemory in place of StaticPlanBlockMemory, and our TIR pipeline (``tvm_ext.tir_pipeline``);
``build_executable`` generates the kernels' machine code on several threads."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import tvm
from tvm import relax
from tvm.relax import vm_build

from relay_passes.plan_memory import PlanMemory
from tvm_ext.tir_pipeline import TIR_PIPELINE

__all__ = ["TIR_PIPELINE", "before_planning", "build_executable", "relax_pipeline"]


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


def build_executable(vm_module: tvm.IRModule, target: tvm.target.Target, jobs: int | None = None
                     ) -> tvm.runtime.Executable:
    """``tvm.compile(vm_module, target, relax_pipeline=None, tir_pipeline=TIR_PIPELINE)``, each kernel
    built as a module of its own on ``jobs`` threads (default: the cores we may use), each thread
    taking the next kernel when it is done, then linked as one library and its imports.

    A thread also generates its kernel's machine code. LLVM does that lazily, at the first lookup
    of a function: left to the VM, the user's first call paid it, on one thread (the transformer
    layer's first call took 0.47 s; its five kernels' machine code is 0.51 s of work, on Zen 4).
    Code generation releases the GIL, so the threads run in parallel. Our kernels are built
    without argument checks (``_without_argument_checks``)."""
    count = sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in vm_module.functions_items())
    if count == 0:
        return tvm.compile(vm_module, target, relax_pipeline=None, tir_pipeline=TIR_PIPELINE)
    jobs = min(jobs or len(os.sched_getaffinity(0)), count)
    attrs = dict(vm_module.attrs) if vm_module.attrs else {}
    builder = relax.ExecBuilder()
    rest = vm_build._vmcodegen(builder, vm_module, "bytecode")  # the kernels, left for us to build
    kernels = [(gv, f) for gv, f in rest.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    context = tvm.transform.PassContext.current()  # thread-local: each thread enters the caller's
    unchecked = _without_argument_checks(context)

    def build(kernel: tuple) -> tvm.runtime.Module:
        gv, func = kernel
        own = func.attrs or {}
        with unchecked if "tvm_ext.kernel" in own else context:
            lib = tvm.tirx.build(tvm.IRModule({gv: func}, attrs=rest.attrs), target=target, pipeline=TIR_PIPELINE)
        lib.get_function(str(own.get("global_symbol", gv.name_hint)))  # machine code, now
        return lib

    if jobs < 2:
        libs = [build(kernel) for kernel in kernels]
    else:
        with ThreadPoolExecutor(jobs) as pool:
            libs = list(pool.map(build, kernels))
    for lib in libs[1:]:
        libs[0].import_module(lib)
    params = dict(attrs.get("const_name_to_constant", {}))
    return vm_build.VMExecutable(vm_build._ffi_api.VMLink(builder, target, libs[0],
                                                          list(attrs.get("external_mods", [])), params))


def _without_argument_checks(context: tvm.transform.PassContext) -> tvm.transform.PassContext:
    """``context`` with TIR's assertions off, for our kernels: their entry then does not check
    its arguments' type, shape, strides and alignment again. The VM passes them its own tensors,
    made from the same shapes, and the model's inputs, which CompiledModel has checked (shape,
    dtype, C order, alignment) and the VM's entry matched against their shapes. The checks were
    about half of a small kernel's LLVM IR: the MLP compiles in 0.21 s instead of 0.27 (Zen 4)."""
    return tvm.transform.PassContext(opt_level=context.opt_level, required_pass=list(context.required_pass),
                                     disabled_pass=list(context.disabled_pass),
                                     instruments=list(context.instruments),
                                     config={**dict(context.config), "tirx.disable_assert": True})
