"""Rollback by measurement: AutoFuse's judge that times a fused kernel against its ops apart.

The seed rolls back a fused node by counting (fewer than two original nodes); it cannot
know whether the kernel is fast. With ``compile(..., rollback="measure")``, and always in
``tune``, each kernel of two or more ops is built alone twice, fused and as one kernel per
op, and timed on the same inputs, interleaved; AutoFuse splits it where the parts are
faster (``StopRules.rollback_margin``). A tuning database keeps both times as records of the
task ``rollback:<hash of the group>``, so ``compile(tuning_db=)`` makes the same decisions
without measuring again.
"""
from __future__ import annotations

import statistics
from typing import Any, Callable

import tvm
import tvm_ffi
from tvm import relax

from relay_passes.autofuse import AutoFuse, RollbackVerdict, StopRules
from relay_passes.graph import DataflowGraph
from relay_passes.grouping import outline_group
from relay_passes.partition import Group
from schedules.database import TuningDatabase, TuningRecord
from schedules.tasks import target_key
from tvm_ext.errors import CompileError
from tvm_ext.machine import Machine

_FUSED, _PARTS = {"rollback": "fused"}, {"rollback": "parts"}


class MeasuredRollback:
    """The judge of ``AutoFuse(judge=...)``: fused time against the parts' time, per kernel.

    ``build(module, fusion)`` compiles a module as the model's pipeline would (the pipeline
    gives its own); ``measure=False`` only reads the decisions recorded in ``db``; ``rounds``
    interleaved timings of each side (each at least ``min_repeat_ms``) give the medians compared.
    """

    def __init__(self, target: Any, build: Callable[[tvm.IRModule, Any], Any], db: TuningDatabase | None = None,
                 measure: bool = True, rules: StopRules | None = None, rounds: int = 5,
                 min_repeat_ms: int = 10, progress: Callable[[str], None] | None = None):
        self.target = target
        self.build = build
        self.machine = Machine.for_target(target)
        self.db = db
        self.measure = measure
        self.rules = rules or StopRules()
        self.rounds = rounds
        self.min_repeat_ms = min_repeat_ms
        self.progress = progress

    def __call__(self, graph: DataflowGraph, group: Group) -> RollbackVerdict | None:
        mod = standalone_module(graph, group)
        key = f"rollback:{tvm_ffi.structural_hash(mod['main']) & (2 ** 64 - 1):016x}"
        verdict = self._recorded(key)
        if verdict is None and self.measure:
            verdict = self._measure(key, mod, graph, group)
        return verdict

    def _recorded(self, key: str) -> RollbackVerdict | None:
        if self.db is None:
            return None
        best = {}
        for r in self.db.records(key, target_key(self.target)):
            if r.ok and r.matches(self.machine):
                side = r.candidate.get("rollback")
                best[side] = min(best.get(side, float("inf")), r.median_ms)
        if "fused" in best and "parts" in best:
            return RollbackVerdict(best["fused"], best["parts"], "recorded")
        return None

    def _measure(self, key: str, mod: tvm.IRModule, graph: DataflowGraph, group: Group) -> RollbackVerdict | None:
        try:
            fused = self.build(mod, AutoFuse(self.rules))
            if sum(1 for k in fused.report().kernels if k.source == "ours") != 1:
                return None  # alone, the group is not the one kernel it is in the model
            parts = self.build(mod, "none")
        except CompileError:
            return None
        inputs = fused.random_inputs()
        times: dict[str, list[float]] = {"fused": [], "parts": []}
        for _ in range(self.rounds):  # interleaved: a slow moment of the machine hits both sides
            for side, model in (("fused", fused), ("parts", parts)):
                times[side].append(model.benchmark(*inputs, number=1, repeat=3,
                                                   min_repeat_ms=self.min_repeat_ms).median_ms)
        verdict = RollbackVerdict(statistics.median(times["fused"]), statistics.median(times["parts"]))
        ops = [graph[n].name for n in group.nodes if graph[n].kind == "op"]
        if self.progress is not None:
            self.progress(f"rollback: kernel of {', '.join(ops)}: fused {verdict.fused_ms:.3f} ms, apart "
                          f"{verdict.parts_ms:.3f} ms")
        if self.db is not None:
            for side, candidate in (("fused", _FUSED), ("parts", _PARTS)):
                self.db.append(TuningRecord(key, target_key(self.target), dict(candidate), times[side],
                                            kernel=",".join(ops), cpu=self.machine.cpu,
                                            vector_bits=self.machine.vector_bits))
        return verdict


def standalone_module(graph: DataflowGraph, group: Group) -> tvm.IRModule:
    """The group as a module of its own: ``main`` takes what the group reads, returns its outputs."""
    func, _, _ = outline_group(graph, group, "main")
    func = relax.Function(func.params, func.body, func.ret_ty, func.is_pure).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})
