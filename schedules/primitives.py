"""TVM's schedule primitives without their Python-side type check.

``tvm.s_tir.Schedule``'s methods are wrapped by ``type_checked``: each call binds its arguments
to the signature and checks every one against its annotation in Python before it reaches C++.
Our builders call a few hundred primitives a kernel, and the checks cost more than many of the
primitives themselves (the transformer layer's fusion and scheduling: 80.6 ms with them, 71.4
without; Zen 4). Our arguments are the schedule's own loop and block handles and our integers,
so the Python check has nothing to catch; TVM's C++ side still checks what the schedule needs.

``prim.split(sch, loop, factors)`` is ``sch.split(loop, factors)`` without the check.
"""
from __future__ import annotations

from typing import Any, Callable

from tvm import s_tir

__all__ = ["prim"]


class _Unchecked:
    """Attribute ``name`` is ``s_tir.Schedule.name`` unwrapped, taking the schedule first."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(s_tir.Schedule, name)
        unwrapped = getattr(method, "__wrapped__", method)
        setattr(self, name, unwrapped)  # looked up once
        return unwrapped


prim = _Unchecked()
