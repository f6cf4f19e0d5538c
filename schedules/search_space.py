"""The tuner's search space of one kernel: every ScheduleResult the policies can build.

A candidate is the list of choices a ScheduleResult records, ``[label, knobs]`` per step
in order: ``"policy@block"`` for a policy applied to one block (and the blocks it claims),
or a policy's bare name for a whole-kernel form (persistent rows). It is plain JSON, so a
record in the tuning database replays to the same schedule with ``apply_candidate``.
"""
from __future__ import annotations

import json
import random
from typing import Iterator

from tvm import tirx

from schedules.analysis import BlockInfo, Machine, block_infos
from schedules.builder import ScheduleBuilder, ScheduleResult
from schedules.heuristic import FAILURES, policies_for, schedule_kernel
from schedules.policies import POLICIES, PersistentRows, Policy

Candidate = list  # [[label, knobs], ...]


def candidate_key(candidate: Candidate) -> str:
    """The canonical text of a candidate: equal schedules, equal keys."""
    return json.dumps(candidate, sort_keys=True, separators=(",", ":"))


def heuristic_candidate(func: tirx.PrimFunc, machine: Machine, fuse_epilogue: bool = True) -> Candidate:
    """The untuned choice (``schedules.heuristic``) as a candidate."""
    result = schedule_kernel(func, machine, fuse_epilogue)
    return [[label, dict(knobs)] for label, knobs in result.choices]


def apply_candidate(func: tirx.PrimFunc, machine: Machine, candidate: Candidate,
                    name: str = "kernel") -> ScheduleResult:
    """Replay a candidate on ``func``; raises ``CandidateError`` if a step no longer applies."""
    builder = ScheduleBuilder(func)
    infos = {i.name: i for i in block_infos(builder.sch)}
    last = list(infos.values())[-1]
    for label, knobs in candidate:
        policy_name, _, block = label.partition("@")
        policy = _policy(policy_name, machine)
        info = infos.get(block) if block else last
        if info is None:
            raise CandidateError(f"candidate step {label!r}: the kernel has no block {block!r}")
        try:
            policy.apply(builder, info, dict(knobs))
        except FAILURES as err:
            raise CandidateError(f"candidate step {label!r} with {knobs}: {err}") from err
        builder.choose(label, knobs)
    return builder.result(name)


class CandidateError(ValueError):
    """A candidate that does not apply to this kernel."""


def enumerate_space(func: tirx.PrimFunc, machine: Machine, limit: int = 2048,
                    seed: int = 0) -> list[Candidate]:
    """Every candidate that applies (each checked by applying it), in a stable order.

    Blocks are scheduled in order, as the heuristic does; each unclaimed block takes one of
    its policies with one of the policy's knob settings. A space larger than ``limit`` is
    sampled: each block's options are shuffled with ``seed`` and the walk stops at ``limit``.
    """
    builder = ScheduleBuilder(func)
    infos = block_infos(builder.sch)
    rng = random.Random(seed)
    out: list[Candidate] = []
    rows = PersistentRows(machine)
    if rows.applies(infos[-1], builder):
        for knobs in rows.candidates(infos[-1]):
            trial = builder.copy()
            try:
                rows.apply(trial, infos[-1], knobs)
            except FAILURES:
                continue
            out.append([[rows.name, knobs]])
    for steps in _walk(builder, infos, 0, set(), machine, rng, limit):
        out.append(steps)
        if len(out) >= limit:
            break
    return out


def _walk(builder: ScheduleBuilder, infos: list[BlockInfo], i: int, done: set[str], machine: Machine,
          rng: random.Random, limit: int) -> Iterator[Candidate]:
    while i < len(infos) and infos[i].name in done:
        i += 1
    if i == len(infos):
        yield []
        return
    info = infos[i]
    options = [(p, k) for p in policies_for(info, machine) if p.applies(info, builder) for k in p.candidates(info)]
    if len(options) > limit:
        rng.shuffle(options)
    for policy, knobs in options:
        trial = builder.copy()
        try:
            claimed = policy.apply(trial, info, dict(knobs))
        except FAILURES:
            continue
        step = [f"{policy.name}@{info.name}", knobs]
        for rest in _walk(trial, infos, i + 1, done | set(claimed), machine, rng, limit):
            yield [step] + rest


def _policy(name: str, machine: Machine) -> Policy:
    for cls in POLICIES:
        if cls.name == name:
            return cls(machine)
    raise CandidateError(f"unknown schedule policy {name!r}; known: {[c.name for c in POLICIES]}")
