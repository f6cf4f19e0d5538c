"""The fuse pattern TVM gives an op we do not lower: legalize the call alone and read the
``op_pattern`` that ``AnnotateTIROpPattern`` writes on its kernel."""
from __future__ import annotations

import tvm
from tvm import relax

from relay_passes.substitute import substitute
from tvm_ext.patterns import OpPattern


def tvm_op_pattern(call: relax.Call) -> OpPattern:
    """TVM's pattern for ``call``'s legalized kernel; Opaque when TVM gives it no kernel."""
    free = relax.analysis.free_vars(call)
    key = (call.op.name, str(call.attrs), tuple(str(a.ty) for a in call.args), tuple(str(v.ty) for v in free))
    return _cached(key, call)


_CACHE: dict = {}  # (op, attrs, argument types) -> pattern; legalizing costs a few ms


def _cached(key, call: relax.Call) -> OpPattern:
    if key not in _CACHE:
        _CACHE[key] = _legalize_and_annotate(call)
    return _CACHE[key]


def _legalize_and_annotate(call: relax.Call) -> OpPattern:
    free = relax.analysis.free_vars(call)
    params = [relax.Var(v.name, v.ty) for v in free]
    bb = relax.BlockBuilder()
    try:
        with bb.function("main", params):
            with bb.dataflow():
                out = bb.emit_output(substitute(call, dict(zip(free, params))))
            bb.emit_func_output(out)
        mod = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                        relax.transform.AnnotateTIROpPattern()])(bb.get())
    except Exception:  # noqa: BLE001 - anything TVM cannot legalize has no pattern
        return OpPattern.OPAQUE
    patterns = [int(f.attrs["op_pattern"]) for f in mod.functions.values()
                if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "op_pattern" in f.attrs]
    return OpPattern.from_tvm(patterns[0]) if len(patterns) == 1 else OpPattern.OPAQUE
