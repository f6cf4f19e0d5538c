"""tvm_ext: a fusion compiler for deep-learning graphs on top of Apache TVM."""
import os as _os

# TVM reads this once, at its first parallel call; without it TVM runs on one thread.
_os.environ.setdefault("TVM_NUM_THREADS", str(len(_os.sched_getaffinity(0))))

from tvm_ext import ops as _ops  # noqa: E402,F401  (fills the op registry)
from tvm_ext.patterns import OpPattern  # noqa: E402
from tvm_ext.registry import OPS, OpDef, register_op  # noqa: E402

__all__ = ["OPS", "OpDef", "OpPattern", "register_op"]
