"""tvm_ext: a fusion compiler for deep-learning graphs on top of Apache TVM.

    import tvm_ext
    compiled = tvm_ext.compile(torch_model, (example_input,))
    y = compiled(x_numpy)
    print(compiled.report())

The core (op registry, Loop IR, patterns, errors) loads eagerly; the pipeline, which uses
the passes of ``relay_passes`` and ``schedules`` (themselves built on the core), loads on
first use, so either package can be imported first.
"""
import importlib as _importlib
import os as _os

# TVM reads this once, at its first parallel call; without it TVM runs on one thread.
_os.environ.setdefault("TVM_NUM_THREADS", str(len(_os.sched_getaffinity(0))))

from tvm_ext import ops as _ops  # noqa: E402,F401  (fills the op registry)
from tvm_ext.errors import (CompileError, DtypeError, FrontendError, InputError, ModelFileError,  # noqa: E402
                            NotLowerable, PlacementError, ShapeError, UnsupportedDtypeError, UnsupportedOpError)
from tvm_ext.patterns import OpPattern  # noqa: E402
from tvm_ext.registry import OPS, OpDef, register_op  # noqa: E402
from tvm_ext import symbol as sym  # noqa: E402  (the Symbol API: op functions from the filled registry)

_LAZY = {
    "compile": "tvm_ext.pipeline", "Pipeline": "tvm_ext.pipeline",
    "CompiledModel": "tvm_ext.compiled_model", "BenchmarkResult": "tvm_ext.compiled_model",
    "TensorSpec": "tvm_ext.compiled_model", "time_calls": "tvm_ext.compiled_model",
    "FusionReport": "tvm_ext.report", "MemoryReport": "tvm_ext.report",
    "KernelInfo": "tvm_ext.report", "host_target": "tvm_ext.target", "tune": "tvm_ext.tuning",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(_importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tvm_ext' has no attribute {name!r}")


__all__ = ["BenchmarkResult", "CompileError", "CompiledModel", "DtypeError", "FrontendError", "FusionReport",
           "InputError", "KernelInfo", "MemoryReport", "ModelFileError", "NotLowerable", "OPS", "OpDef",
           "OpPattern", "Pipeline", "PlacementError",
           "ShapeError", "TensorSpec", "UnsupportedDtypeError", "UnsupportedOpError", "compile",
           "host_target", "register_op", "sym", "time_calls", "tune"]
