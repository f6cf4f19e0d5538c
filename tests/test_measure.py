"""Measurement: candidates built in worker processes and timed locally or over TVM's RPC;
a candidate that fails to build, crashes or hangs is recorded as a failure and the rest
are measured."""
from __future__ import annotations

import os
import re
import threading
import time

import numpy as np
import psutil
import pytest
import tvm
from tvm import s_tir, te, tirx
from tvm.rpc.tracker import Tracker
from tvm.script import tirx as T

from schedules.measure import (
    BuildResult,
    LocalBuilder,
    LocalRunner,
    MeasureInput,
    MeasureResult,
    RPCRunner,
    arg_specs,
    measure,
    random_args,
    start_rpc_server,
)
from schedules.workers import Worker, default_num_threads, describe_exit, error_message
from tvm_ext.host_memory import PAGE, HostBuffer
from tvm_ext.target import host_target

TARGET = host_target()
TIMEOUT_S = 2.5


def add(n: int = 64) -> tirx.PrimFunc:
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    return te.create_prim_func([A, B, te.compute((n, n), lambda i, j: A[i, j] + B[i, j], name="C")])


def add_vectorized(n: int = 64) -> tirx.PrimFunc:
    sch = s_tir.Schedule(add(n))
    i, j = sch.get_loops(sch.get_sblock("C"))
    sch.parallel(i)
    sch.vectorize(sch.split(j, [None, 16])[1])
    return sch.mod["main"]


@T.prim_func
def segfault(A: T.Buffer((64,), "float32")):
    for i in range(T.int64(64)):  # 4 TiB past the buffer: unmapped
        A[i * T.int64(1 << 40)] = T.float32(1)


@T.prim_func
def endless(A: T.Buffer((64,), "float32")):
    for i in range(T.int64(10**12)):
        A[i % T.int64(64)] = A[i % T.int64(64)] + T.float32(1)


@T.prim_func
def _with_n(A: T.Buffer((64,), "float32"), n: T.int32):
    A[n] = T.float32(1)


# n is used but no longer a parameter: "variables (n,) are used, but are not passed in as API arguments"
unbound = tirx.PrimFunc([_with_n.params[0]], _with_n.body, _with_n.ret_type, attrs=_with_n.attrs)


@pytest.fixture(scope="module")
def builder():
    with LocalBuilder(workers=2, timeout_s=60) as b:
        yield b


@pytest.fixture(scope="module")
def runner():
    with LocalRunner(timeout_s=TIMEOUT_S, number=2, repeat=3, num_threads=1) as r:
        yield r


def test_good_candidates_build_and_time(builder, runner):
    inputs = [MeasureInput("add", add(), TARGET), MeasureInput("add_vec", add_vectorized(), TARGET),
              MeasureInput("add_llvm", add(32), {"kind": "llvm"})]
    builds = builder.build(inputs)
    assert [b.key for b in builds] == ["add", "add_vec", "add_llvm"]
    for b in builds:
        assert b.error is None and os.path.getsize(b.artifact) > 0 and b.seconds > 0
    results = runner.run(inputs, builds)
    for r in results:
        assert r.ok and r.error is None and r.device == "local"
        assert len(r.times_ms) == 3 and all(t > 0 for t in r.times_ms)
        assert 0 < r.median_ms < 10 and r.run_s > 0 and r.build_s > 0


def test_a_build_failure_is_an_error_and_the_others_are_measured(builder, runner):
    inputs = [MeasureInput("unbound", unbound, TARGET), MeasureInput("good", add(), TARGET),
              MeasureInput("no_such_target", add(), {"kind": "no_such_kind"})]
    results = measure(inputs, builder, runner)
    assert [r.key for r in results] == ["unbound", "good", "no_such_target"]
    assert results[0].error.startswith("build: ") and "are not passed in as API arguments" in results[0].error
    assert results[2].error.startswith("build: ") and "no_such_kind" in results[2].error
    for r in (results[0], results[2]):
        assert not r.ok and r.times_ms == [] and r.median_ms == float("inf") and r.run_s == 0
    assert results[1].ok


def test_crashing_and_hanging_candidates_fail_and_the_rest_are_measured(builder, runner):
    inputs = [MeasureInput("a", add(), TARGET), MeasureInput("crash", segfault, TARGET), MeasureInput("b", add(), TARGET),
              MeasureInput("hang", endless, TARGET), MeasureInput("c", add_vectorized(), TARGET)]
    builds = builder.build(inputs)
    assert all(b.error is None for b in builds)
    start = time.perf_counter()
    results = runner.run(inputs, builds)
    assert [r.key for r in results] == ["a", "crash", "b", "hang", "c"]
    assert results[1].error == "run: crashed (signal 11, SIGSEGV)"
    assert results[3].error == f"run: timeout after {TIMEOUT_S:g} s"
    assert TIMEOUT_S <= results[3].run_s < TIMEOUT_S + 5
    assert [r.ok for r in results] == [True, False, True, False, True]
    assert time.perf_counter() - start < 60


def test_a_build_over_its_timeout_fails(builder):
    # 3000 unrolled exp * log statements take LLVM seconds (2000: 1.1 s here): over a 0.5 s limit
    x = te.placeholder((3000,), "float32", name="x")
    y = te.compute((3000,), lambda i: te.exp(x[i]) * te.log(x[i] + 1.0), name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]))
    sch.unroll(sch.get_loops(sch.get_sblock("y"))[0])
    builder.timeout_s = 0.5
    try:
        [slow] = builder.build([MeasureInput("slow", sch.mod["main"], TARGET)])
    finally:
        builder.timeout_s = 60
    assert slow.error == "build: timeout after 0.5 s" and slow.artifact is None and slow.seconds < 10
    # the stuck worker was replaced: both build again
    fast = builder.build([MeasureInput(f"fast{i}", add(8), TARGET) for i in range(2)])
    assert all(b.error is None and b.artifact.startswith(str(builder.workdir)) for b in fast)


def test_arguments_follow_the_parameters_and_threads_follow_tvm_num_threads(runner):
    assert arg_specs(add(16)) == [((16, 16), "float32")] * 3
    with pytest.raises(TypeError, match="not a buffer"):
        arg_specs(_with_n)
    bad = MeasureResult("x", [], None, 0, 0)
    assert not bad.ok and bad.median_ms == float("inf")
    # a scalar parameter cannot get a random tensor: an error result, not an exception
    res = runner.run([MeasureInput("scalar", _with_n, TARGET)], [BuildResult("scalar", "/nonexistent.so", None, 0.1)])
    assert res[0].error.startswith("run: parameter n") and not res[0].ok
    # the runner's worker uses the thread count it was given, whatever this process has
    assert os.environ["TVM_NUM_THREADS"] == str(default_num_threads())
    threads, error, _ = runner.pool.call(tvm.runtime.num_threads)
    assert error is None and threads == 1


def test_worker_errors_name_the_signal_or_the_exception_and_a_stuck_child_is_killed():
    assert describe_exit(-11) == "crashed (signal 11, SIGSEGV)"
    assert describe_exit(-6) == "crashed (signal 6, SIGABRT)"
    assert describe_exit(3) == "worker exited (code 3)"
    trace = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    g()\nValueError: bad\nsecond line'
    assert error_message(trace) == "ValueError: bad | second line"
    # the child's own timer cannot answer while the call holds the GIL: the parent kills it
    worker = Worker(grace_s=1.0)
    try:
        assert worker.call(sum, ([1],)) == (1, None)  # started
        start = time.perf_counter()
        # catastrophic backtracking: one C call that never releases the GIL
        assert worker.call(re.match, (r"(a+)+$", "a" * 64 + "b"), timeout_s=0.5) == (None, "timeout after 0.5 s")
        assert 1.5 <= time.perf_counter() - start < 10 and not worker.is_alive()  # after timeout + grace
        assert worker.call(sum, ([1, 2],), timeout_s=5) == (3, None)  # a fresh process took over
    finally:
        worker.close()


# --------------------------------------------------------------------------- RPC on loopback
def _registered(tracker_port: int, key: str) -> int:
    return len(RPCRunner.servers_at("127.0.0.1", tracker_port, key))


@pytest.fixture
def rpc_cluster():
    """A tracker and two servers on 127.0.0.1 (free ports), stopped afterwards with every
    process they started."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    tracker = Tracker("127.0.0.1", port=19190, port_end=19290, silent=True)
    servers = [None, None]

    def start(i):
        # a port range each: started at once, two servers could bind-race for the same free port
        # ("Address already in use": one server failed, once in a full suite run)
        servers[i] = start_rpc_server("127.0.0.1", tracker.port, "test", host="127.0.0.1", port=19300 + 100 * i,
                                      port_end=19400 + 100 * i)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # TVM's Tracker and Server run in `python -m tvm.exec.popen_worker` children
    ours = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and "tvm.exec.popen_worker" in p.cmdline()]
    try:
        deadline = time.time() + 30
        while _registered(tracker.port, "test") < 2 and time.time() < deadline:
            time.sleep(0.1)
        yield tracker, servers
    finally:
        for p in list(ours):
            if p.is_running():
                ours += p.children(recursive=True)  # sessions the servers forked
        for s in servers:
            if s is not None:
                s.terminate()
        tracker.terminate()
        alive = psutil.wait_procs(ours, timeout=10)[1]
        assert len(ours) >= 3 and not alive, f"processes left running: {[(p.pid, p.cmdline()) for p in alive]}"


def test_rpc_runner_spreads_over_two_servers_and_survives_bad_candidates(rpc_cluster, builder):
    tracker, servers = rpc_cluster
    assert {s.port for s in servers} == {p for _, p in RPCRunner.servers_at("127.0.0.1", tracker.port, "test")}
    names = ["add"] * 3 + ["crash"] + ["add"] * 2 + ["hang"] + ["add"] * 3
    funcs = {"add": add(), "crash": segfault, "hang": endless}
    inputs = [MeasureInput(f"{i}_{n}", funcs[n], TARGET) for i, n in enumerate(names)]
    with RPCRunner("127.0.0.1", tracker.port, "test", timeout_s=TIMEOUT_S, number=2, repeat=3) as runner:
        assert runner.parallel == 2
        runner.pool.wait_started()  # both workers take candidates from the first one on
        results = measure(inputs, builder, runner)
    by_name = {r.key: r for r in results}
    assert by_name["3_crash"].error == "run: crashed (RPC session ended)"
    assert by_name["6_hang"].error == f"run: timeout after {TIMEOUT_S:g} s (RPC session expired)"
    good = [r for r in results if "add" in r.key]
    assert all(r.ok and len(r.times_ms) == 3 and all(t > 0 for t in r.times_ms) for r in good)
    # each result names its server (host:pid); while one server held the hanging candidate,
    # the candidates after it went to the other
    assert len({r.device for r in results}) == 2 and all(r.device for r in results)
    assert by_name["6_hang"].device not in {r.device for r in results[7:]}
    # a crashed session did not take its server out: both are still registered
    assert _registered(tracker.port, "test") == 2


def test_arguments_are_page_aligned_as_in_a_call():
    """The runner's arguments start on a page, as the compiled model's buffers do (heap
    placement put a softmax's output 1-2 cache lines ahead of its input in some runs: 4K
    aliasing, up to 29% slower); below a page, on a cache line."""
    specs = [((256, 300), "float32"), ((7,), "float32"), ((3, 500), "float32"), ((40,), "int64")]
    args = random_args(specs, tvm.cpu(0))
    arrays = [np.from_dlpack(a) for a in args]
    assert [a.shape for a in arrays] == [s for s, _ in specs]
    assert [a.ctypes.data % PAGE for a in arrays if a.nbytes >= PAGE] == [0, 0]
    assert all(a.ctypes.data % 64 == 0 for a in arrays)
    assert all(((a >= 0.1) & (a < 1.0)).all() for a in arrays[:3]) and not arrays[3].any()
    assert HostBuffer(PAGE).data.ctypes.data % PAGE == 0 and HostBuffer(100).data.ctypes.data % 64 == 0
