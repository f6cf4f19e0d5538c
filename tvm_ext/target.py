"""The compilation target: by default this machine's CPU with all its cores."""
from __future__ import annotations

import os

import tvm

from tvm_ext.machine import has_avx512, host_mcpu


def host_target(cores: int | None = None) -> tvm.target.Target:
    """LLVM for the host CPU (its exact mcpu, so AVX-512 is used where present; see
    ``machine.host_mcpu``)."""
    return cpu_target(host_mcpu(), cores)


def cpu_target(mcpu: str, cores: int | None = None) -> tvm.target.Target:
    """LLVM for an x86-64 CPU by its LLVM name (``znver3``, ``skylake-avx512``, ``x86-64``).

    On AVX-512 CPUs LLVM still prefers 256-bit vectors unless told otherwise; our kernels
    are written for full-width vectors (a vectorized exp ran 2.0x faster with them), so the
    target lifts that preference.

    LLVM optimizes at -O2, not TVM's default -O3: our kernels arrive scheduled, vectorized and
    unrolled, and O3's extra passes cost build time without making them faster (Zen 4, 18
    benchmark models: kernels within +-2% but layer_norm 8% faster at O2; the transformer
    layer compiles in 0.41 s instead of 0.50, matmul 512 in 0.065 s instead of 0.095).
    """
    cores = cores or len(os.sched_getaffinity(0))
    config = {"kind": "llvm", "mcpu": mcpu, "num-cores": cores, "opt-level": 2}
    if has_avx512(tvm.target.Target(config)):
        config["mattr"] = ["-prefer-256-bit"]
    return tvm.target.Target(config)


def resolve_target(target: str | dict | tvm.target.Target | None) -> tvm.target.Target:
    """Accept None (the host), "llvm", a dict, or a Target."""
    if target is None:
        return host_target()
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str):
        if target in ("llvm", "cpu", "host"):
            return host_target()
        return tvm.target.Target({"kind": target})
    return tvm.target.Target(target)
