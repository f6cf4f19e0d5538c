"""The tuner's search space of one kernel: every ScheduleResult the policies can build.

A candidate is the list of choices a ScheduleResult records, ``[label, knobs]`` per step
in order: ``"policy@block"`` for a policy applied to one block (and the blocks it claims),
or a policy's bare name for a whole-kernel form (persistent rows). It is plain JSON, so a
record in the tuning database replays to the same schedule with ``apply_candidate``.
"""
from __future__ import annotations

import itertools
import json
import random
from typing import Iterable, Iterator

import tvm_ffi
from tvm import tirx

from schedules.analysis import BlockInfo
from schedules.builder import ScheduleBuilder, ScheduleResult
from schedules.heuristic import policies_for, schedule_kernel, whole_kernel_policies
from schedules.policies import FAILURES, POLICIES, Policy
from tvm_ext.machine import Machine

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
    infos = {i.name: i for i in builder.infos()}
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
                    prefer: Candidate | None = None) -> list[tuple[Candidate, ScheduleResult]]:
    """Every candidate that applies, with its ScheduleResult, in a stable order, one for
    each distinct kernel (see ``_distinct``; ``prefer`` is kept among those that build the
    same one: the heuristic's, which the tuner measures first).

    Blocks are scheduled in order, as the heuristic does; each unclaimed block takes one of
    its policies with one of the policy's knob settings. The walk stops at ``limit``: use
    ``sample_space`` for a space larger than that (the first ``limit`` leaves of the walk
    all share its first choices).
    """
    builder = ScheduleBuilder(func)
    infos = builder.infos()
    # each step chose its knobs on the way (Policy.trial)
    leaves = ((steps, leaf.result("kernel")) for steps, leaf in _walk(builder, infos, 0, set(), machine))
    return _distinct(_whole_kernel_forms(builder, infos, machine), leaves, limit, prefer)


def sample_space(func: tirx.PrimFunc, machine: Machine, n: int, seed: int = 0,
                 attempts: int = 4, prefer: Candidate | None = None) -> list[tuple[Candidate, ScheduleResult]]:
    """Up to ``n`` candidates of distinct kernels by random walks (each block's option drawn
    uniformly), for spaces too large to enumerate."""
    rng = random.Random(seed)
    builder = ScheduleBuilder(func)
    infos = builder.infos()
    walks = (_random_walk(builder, infos, machine, rng) for _ in range(attempts * n))
    return _distinct(_whole_kernel_forms(builder, infos, machine), (w for w in walks if w is not None), n, prefer)


def _distinct(first: list, more: Iterable[tuple[Candidate, ScheduleResult]], limit: int,
              prefer: Candidate | None) -> list[tuple[Candidate, ScheduleResult]]:
    """Up to ``limit`` candidates, one per distinct kernel. A knob can change nothing for a
    block (``epilogue`` where the anchor has none, ``i_block`` without ``k_block``, an unroll
    of a loop that is not there): such candidates build one kernel under several keys, and
    each would be measured (a third to a half of a matmul's or convolution's settings)."""
    preferred = candidate_key(prefer) if prefer is not None else None
    out: list = []
    by_hash: dict[int, list[int]] = {}
    for candidate, result in itertools.chain(first, more):
        h = tvm_ffi.structural_hash(result.func.body)
        twin = next((i for i in by_hash.get(h, []) if tvm_ffi.structural_equal(out[i][1].func.body, result.func.body)),
                    None)
        if twin is not None:
            if candidate_key(candidate) == preferred:
                out[twin] = (candidate, result)
            continue
        if len(out) >= limit:
            break
        by_hash.setdefault(h, []).append(len(out))
        out.append((candidate, result))
    return out


def space_bound(func: tirx.PrimFunc, machine: Machine) -> int:
    """An upper bound of the space's size: the product of each block's options (blocks a
    policy claims, and options that fail, make the real space smaller)."""
    builder = ScheduleBuilder(func)
    infos = builder.infos()
    bound = 1
    for info in infos:
        bound *= max(1, len(_options(builder, info, machine)))
    return bound + len(_whole_kernel_forms(builder, infos, machine))


def _whole_kernel_forms(builder: ScheduleBuilder, infos: list[BlockInfo],
                        machine: Machine) -> list[tuple[Candidate, ScheduleResult]]:
    out = []
    for form in whole_kernel_policies(machine):
        if form.applies(infos[-1], builder):
            for knobs in form.candidates(infos[-1]):
                tried = form.trial(builder, infos[-1], knobs, label=form.name)
                if tried is not None:
                    out.append(([[form.name, knobs]], tried[0].result("kernel")))
    return out


def _options(builder: ScheduleBuilder, info: BlockInfo, machine: Machine) -> list[tuple[Policy, dict]]:
    return [(p, k) for p in policies_for(info, machine) if p.applies(info, builder) for k in p.candidates(info)]


def _walk(builder: ScheduleBuilder, infos: list[BlockInfo], i: int, done: set[str],
          machine: Machine) -> Iterator[tuple[Candidate, ScheduleBuilder]]:
    while i < len(infos) and infos[i].name in done:
        i += 1
    if i == len(infos):
        yield [], builder
        return
    info = infos[i]
    for policy, knobs in _options(builder, info, machine):
        tried = policy.trial(builder, info, knobs)
        if tried is None:
            continue
        trial, claimed = tried
        step = [f"{policy.name}@{info.name}", knobs]
        for rest, leaf in _walk(trial, infos, i + 1, done | set(claimed), machine):
            yield [step] + rest, leaf


def _random_walk(builder: ScheduleBuilder, infos: list[BlockInfo], machine: Machine,
                 rng: random.Random) -> tuple[Candidate, ScheduleResult] | None:
    steps, done = [], set()
    for info in infos:
        if info.name in done:
            continue
        options = _options(builder, info, machine)
        rng.shuffle(options)
        for policy, knobs in options:
            tried = policy.trial(builder, info, knobs)
            if tried is None:
                continue
            builder, claimed = tried
            steps.append([f"{policy.name}@{info.name}", knobs])
            done = done | set(claimed)
            break
        else:
            return None
    return steps, builder.result("kernel")


def _policy(name: str, machine: Machine) -> Policy:
    for cls in POLICIES:
        if cls.name == name:
            return cls(machine)
    raise CandidateError(f"unknown schedule policy {name!r}; known: {[c.name for c in POLICIES]}")
