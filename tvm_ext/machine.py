"""The machine facts every layer may read: the target's cores, vector width and caches.

Schedules size tiles and choose parallel splits against a ``Machine``; the target helpers
(``tvm_ext.target``) ask whether a CPU has AVX-512; tuning records name the machine's CPU.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import tvm

from tvm_ext.host_cpu import host_caches, host_cpu_name


@dataclass(frozen=True)
class Machine:
    """The target's shape, as schedules see it."""

    cores: int = len(os.sched_getaffinity(0))
    vector_bytes: int = 64  # AVX-512
    l1_bytes: int = 48 << 10
    l2_bytes: int = 2 << 20  # per core
    l3_bytes: int = 32 << 20
    parallel_min_elems: int = 4096  # below this a parallel launch costs more than it saves
    cpu: str = ""  # the CPU's model where known (the host's): tuning records name it

    @classmethod
    def for_target(cls, target: tvm.target.Target) -> "Machine":
        """The machine a target describes: its vector width from LLVM's features for its mcpu
        and mattr (AVX-512: 64 bytes, AVX/AVX2: 32, plain x86-64's SSE2: 16). A target for
        this host's CPU also takes the host's cache sizes and model from the OS; any other
        keeps the defaults (the host's caches say nothing of another CPU)."""
        cores = int(target.attrs.get("num-cores", 0) or len(os.sched_getaffinity(0)))
        machine = cls(cores=cores, vector_bytes=vector_bytes(target))
        if is_host(target):
            caches = host_caches()
            machine = replace(machine, cpu=host_cpu_name(),
                              **({} if caches is None else dict(l1_bytes=caches.l1d, l2_bytes=caches.l2,
                                                                l3_bytes=caches.l3)))
        return machine

    @property
    def vector_bits(self) -> int:
        return self.vector_bytes * 8

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers: 32 with AVX-512 (zmm0-31), 16 with AVX2 or SSE."""
        return 32 if self.vector_bytes >= 64 else 16


def is_host(target: tvm.target.Target) -> bool:
    """Whether ``target`` is an LLVM target for exactly this host's CPU."""
    return target.kind.name == "llvm" and str(target.attrs.get("mcpu", "")) == \
        tvm.target.codegen.llvm_get_system_cpu()


def _has(feature: str, target: tvm.target.Target) -> bool:
    mattr = [str(a) for a in target.attrs.get("mattr", []) or []]
    if f"+{feature}" in mattr:
        return True
    if f"-{feature}" in mattr:
        return False
    try:
        return bool(tvm.target.codegen.target_has_features(feature, target))
    except Exception:  # noqa: BLE001 - not an LLVM x86 target: no such feature
        return False


def has_avx512(target: tvm.target.Target) -> bool:
    return _has("avx512f", target)


def vector_bytes(target: tvm.target.Target) -> int:
    if has_avx512(target):
        return 64
    return 32 if _has("avx", target) else 16
