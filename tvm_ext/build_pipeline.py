"""What ``tvm.compile`` runs on our lowered module: TVM's default Relax VM pipeline with
PlanMemory in place of StaticPlanBlockMemory, and our TIR pipeline (``tvm_ext.tir_pipeline``);
``build_executable`` generates the kernels' machine code on several threads."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import tvm
import tvm_ffi
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
    """``tvm.compile(vm_module, target, relax_pipeline=None, tir_pipeline=TIR_PIPELINE)``, with the
    kernels' code generated on ``jobs`` threads (default: the cores we may use), then linked as
    one library and its imports.

    The kernels are shared out among the threads by their size (``kernel_groups``) and each
    thread builds its share as one module: LLVM pays about 14 ms a module before any kernel's
    code (five trivial kernels: 85 ms as five modules, 30 ms as one). On two threads, Zen 4:
    the transformer layer's five kernels 0.231 -> 0.213 s, the inverted residual's four 0.137
    -> 0.121 s, 12 x (Linear, GELU, LayerNorm) compiles in 1.36-1.40 s instead of 1.45-1.57.

    A thread also generates its kernels' machine code. LLVM does that lazily, at the first lookup
    of a function: left to the VM, the user's first call paid it, on one thread (the transformer
    layer's first call took 0.47 s; its five kernels' machine code is 0.51 s of work, on Zen 4).
    Code generation releases the GIL, so the threads run in parallel. Our kernels are built
    without argument checks (``_without_argument_checks``).

    The VM's bytecode is generated meanwhile, on the calling thread: it hashes each constant
    twice (TVM's ExecBuilder dedups them by content), 17 ms for the 16 MiB weight of a 2048^2
    or an MLP-up matmul, whose one kernel leaves a core free for it."""
    count = sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in vm_module.functions_items())
    if count == 0:
        return tvm.compile(vm_module, target, relax_pipeline=None, tir_pipeline=TIR_PIPELINE)
    threads = jobs or len(os.sched_getaffinity(0))
    jobs = min(threads, count)
    attrs = dict(vm_module.attrs) if vm_module.attrs else {}
    kernels = [(gv, f) for gv, f in vm_module.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    context = tvm.transform.PassContext.current()  # thread-local: each thread enters the caller's
    unchecked = _without_argument_checks(context)
    ours = [k for k in kernels if "tvm_ext.kernel" in (k[1].attrs or {})]
    others = [k for k in kernels if "tvm_ext.kernel" not in (k[1].attrs or {})]
    shares = [(unchecked, group) for group in kernel_groups(ours, jobs)]
    shares += [(context, group) for group in kernel_groups(others, jobs)]

    def build(share: tuple) -> tvm.runtime.Module:
        ctx, group = share
        with ctx:
            lib = tvm.tirx.build(tvm.IRModule(dict(group), attrs=vm_module.attrs), target=target, pipeline=TIR_PIPELINE)
        for gv, func in group:  # machine code, now
            lib.get_function(str((func.attrs or {}).get("global_symbol", gv.name_hint)))
        return lib

    builder = relax.ExecBuilder()
    if threads < 2:
        vm_build._vmcodegen(builder, vm_module, "bytecode")
        libs = [build(share) for share in shares]
    else:
        with ThreadPoolExecutor(threads) as pool:
            built = pool.map(build, shares)
            vm_build._vmcodegen(builder, vm_module, "bytecode")  # the VM's bytecode, meanwhile
            libs = list(built)
    for lib in libs[1:]:
        libs[0].import_module(lib)
    params = dict(attrs.get("const_name_to_constant", {}))
    return vm_build.VMExecutable(vm_build._ffi_api.VMLink(builder, target, libs[0],
                                                          list(attrs.get("external_mods", [])), params))


def kernel_groups(kernels: list, groups: int) -> list[list]:
    """``kernels`` ((GlobalVar, PrimFunc) pairs) in at most ``groups`` groups of about equal
    ``code_size``: the largest first, each to the group with the least so far."""
    groups = min(groups, len(kernels))
    if groups == 0:
        return []
    out, load = [[] for _ in range(groups)], [0] * groups
    for size, kernel in sorted(((code_size(k[1]), k) for k in kernels), key=lambda p: -p[0]):
        least = load.index(min(load))
        out[least].append(kernel)
        load[least] += size
    return out


#: a kernel's own fixed share of its module's code (its entry, the parallel launches' setup)
_KERNEL_BASE = 40


def code_size(func: tvm.tirx.PrimFunc) -> int:
    """About how much code the kernel becomes, for sharing kernels out among threads: the
    expression nodes of each store, times the iterations of the unrolled loops around it, and
    a constant for each kernel and for each parallel loop (an outlined function each)."""
    return _KERNEL_BASE + _emitted(func.body, 1)


def _emitted(stmt, times: int) -> int:
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return sum(_emitted(s, times) for s in stmt.seq)
    if isinstance(stmt, tvm.tirx.For):
        unrolled = stmt.kind == tvm.tirx.ForKind.UNROLLED and isinstance(stmt.extent, tvm.tirx.IntImm)
        own = 20 if stmt.kind == tvm.tirx.ForKind.PARALLEL else 1
        return own * times + _emitted(stmt.body, times * int(stmt.extent) if unrolled else times)
    if isinstance(stmt, tvm.tirx.BufferStore):
        nodes = [0]

        def count(node):
            if isinstance(node, tvm.tirx.Buffer):  # a load's buffer: its shape is no code
                return tvm_ffi.WalkResult.SKIP
            nodes[0] += isinstance(node, tvm.tirx.Expr)
        tvm_ffi.structural_walk(stmt.value, count, order="pre")
        return times * (2 + nodes[0])
    total = 0
    for field in ("block", "body", "init", "then_case", "else_case"):
        child = getattr(stmt, field, None)
        if isinstance(child, tvm.tirx.Stmt):
            total += _emitted(child, times)
    return total


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
