"""TVM's own ways of building a module, the peers our numbers are measured against."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_ext.report import kernels_of
from tvm_ext.target import resolve_target


def tvm_default_build(mod: tvm.IRModule, target=None) -> relax.VirtualMachine:
    """``tvm.compile`` as TVM does it on CPU: legalized ops, no fusion, no schedules."""
    return relax.VirtualMachine(tvm.compile(mod, resolve_target(target)), tvm.cpu())


def tvm_fused_module(mod: tvm.IRModule, target=None) -> tvm.IRModule:
    """The module after TVM's own fusion: LegalizeOps, AnnotateTIROpPattern, FuseOps, FuseTIR
    (and RewriteDataflowReshape, which turns lone reshapes into views, as in our pipeline)."""
    seq = [relax.transform.ConvertToDataflow(), relax.transform.LegalizeOps(),
           relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(), relax.transform.FuseOps(),
           relax.transform.FuseTIR(), relax.transform.RewriteDataflowReshape(),
           relax.transform.DeadCodeElimination()]
    with resolve_target(target):
        return tvm.transform.Sequential(seq)(mod)


def tvm_fused_kernel_count(mod: tvm.IRModule) -> int:
    """How many kernels TVM's FuseOps + FuseTIR leave in ``main``."""
    kernels, _ = kernels_of(tvm_fused_module(mod))
    return len(kernels)


def call_as_users_do(vm: relax.VirtualMachine, *arrays: np.ndarray):
    """TVM's VM called as its users call it: tensors made from numpy, results back to numpy."""
    result = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    if isinstance(result, tvm.runtime.Tensor):
        return result.numpy()
    return [r.numpy() if isinstance(r, tvm.runtime.Tensor) else r for r in result]
