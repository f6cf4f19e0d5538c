"""The machine facts every layer may read: the target's cores, vector width, FMA units and caches.

Schedules size tiles and choose parallel splits against a ``Machine``; the target helpers
(``tvm_ext.target``) ask whether a CPU has AVX-512; tuning records name the machine's CPU.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import tvm

from tvm_ext.host_cpu import host_caches, host_cpu_flags, host_cpu_name

#: names the CPU that host targets build for, in place of the one detected (``host_mcpu``)
HOST_MCPU_VARIABLE = "TVM_EXT_HOST_MCPU"

# the x86-64 levels (psABI), each with the /proc/cpuinfo flags it needs beyond the one before
# (``abm`` is how Linux names LZCNT)
_LEVELS = (("x86-64-v2", {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}),
           ("x86-64-v3", {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}),
           ("x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}))

# What the OS does not report: how many full-width vector FMAs a core starts each cycle, and
# after how many cycles one's result is there, by LLVM's name for the CPU (the vendors'
# optimization manuals). Not listed: two units of four cycles, as in Intel's cores since
# Skylake (the server ones with two 512-bit units; a Xeon with one is taken for two) and
# AMD's since Zen 3. Zen 4 runs an AVX-512 FMA through both of its 256-bit units, Intel's
# client cores with AVX-512 have one 512-bit unit; Zen 1 splits 256 bits in two halves.
# Sandy and Ivy Bridge have no FMA: a multiply and an add a cycle, the add's three cycles.
_FMA_UNITS = {"znver1": 1, "znver4": 1, "cannonlake": 1, "icelake-client": 1, "tigerlake": 1, "rocketlake": 1,
              "sandybridge": 1, "ivybridge": 1}
_FMA_LATENCY = {"znver1": 5, "znver2": 5, "haswell": 5, "broadwell": 5, "sandybridge": 3, "ivybridge": 3}


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
    fma_units: int = 2  # full-width vector FMAs a core starts each cycle
    fma_latency: int = 4  # cycles from an FMA to its result

    @classmethod
    def for_target(cls, target: tvm.target.Target) -> "Machine":
        """The machine a target describes: its vector width from LLVM's features for its mcpu
        and mattr (AVX-512: 64 bytes, AVX/AVX2: 32, plain x86-64's SSE2: 16). A target for
        this host's CPU also takes the host's cache sizes and model from the OS; any other
        keeps the defaults (the host's caches say nothing of another CPU). The FMA units and
        latency come from the mcpu's name (``_FMA_UNITS``)."""
        cores = int(target.attrs.get("num-cores", 0) or len(os.sched_getaffinity(0)))
        mcpu = str(target.attrs.get("mcpu", ""))
        machine = cls(cores=cores, vector_bytes=vector_bytes(target), fma_units=_FMA_UNITS.get(mcpu, cls.fma_units),
                      fma_latency=_FMA_LATENCY.get(mcpu, cls.fma_latency))
        if is_host(target):
            caches = host_caches()
            machine = replace(machine, cpu=host_cpu_name(),
                              **({} if caches is None else dict(l1_bytes=caches.l1d, l2_bytes=caches.l2,
                                                                l3_bytes=caches.l3)))
        return machine

    @property
    def vector_bits(self) -> int:
        return self.vector_bytes * 8

    def tile_accumulators(self, bits: int = 32) -> int:
        """The sums (of ``bits``-bit elements) a register tile must keep in flight for the FMA
        units never to wait: each unit starts an FMA a cycle whose sum returns ``fma_latency``
        cycles later, so ``units x latency`` vectors of independent sums (BLIS's rule for its
        micro-tile, m_r x n_r >= lanes x latency x units). Zen 4: 64 float32, an AVX-512 Xeon 128."""
        return self.fma_units * self.fma_latency * self.vector_bits // bits

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers: 32 with AVX-512 (zmm0-31), 16 with AVX2 or SSE."""
        return 32 if self.vector_bytes >= 64 else 16


def host_mcpu() -> str:
    """LLVM's name for the CPU that host targets build for: ``TVM_EXT_HOST_MCPU`` where set (to
    build and run as on another CPU whose instructions this one has, e.g. ``znver3`` for AVX2),
    else the one detected (``detected_host_mcpu``)."""
    forced = os.environ.get(HOST_MCPU_VARIABLE, "").strip()
    if not forced:
        return detected_host_mcpu()
    if not tvm.target.codegen.llvm_is_valid_cpu(forced, tvm.target.codegen.llvm_get_system_triple()):
        raise ValueError(f"{HOST_MCPU_VARIABLE}={forced!r} is not a CPU LLVM knows: use one of LLVM's names "
                         "for x86-64 CPUs (znver3, skylake-avx512, x86-64-v3, x86-64) or unset it")
    return forced


@functools.lru_cache(maxsize=1)
def detected_host_mcpu() -> str:
    """LLVM's name for this CPU, unless the OS reports vector instructions that name lacks (a
    CPU newer than this LLVM, or a hypervisor that shows a generic model): then the x86-64
    level its flags reach (``x86-64-v3``: AVX2 and FMA; ``x86-64-v4``: AVX-512), so that the
    kernels still use the whole vector width."""
    named = tvm.target.codegen.llvm_get_system_cpu()
    return level_for(named, host_cpu_flags())


def level_for(named: str, flags: frozenset[str]) -> str:
    """``named``, or the highest x86-64 level that ``flags`` (the OS's, as in /proc/cpuinfo)
    reach where that level has wider vectors than ``named``."""
    level, need = "", set()
    for name, more in _LEVELS:
        need |= more
        if not need <= flags:
            break
        level = name
    if level and vector_bytes(_llvm(level)) > vector_bytes(_llvm(named)):
        return level
    return named


def _llvm(mcpu: str) -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu})


def is_host(target: tvm.target.Target) -> bool:
    """Whether ``target`` is an LLVM target for exactly the CPU host targets build for."""
    return target.kind.name == "llvm" and str(target.attrs.get("mcpu", "")) == host_mcpu()


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
