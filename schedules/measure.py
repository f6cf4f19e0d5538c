"""Measuring candidate kernels: build them, time them, never stop for a bad one.

``measure(inputs, builder, runner)`` builds every candidate into a shared library in
parallel worker processes (``LocalBuilder``), then times each one with a runner: on this
machine (``LocalRunner``) or on others through TVM's RPC tracker (``RPCRunner``). Each
candidate runs in a subprocess (locally) or an RPC session (remotely) under a timeout, on
random inputs of its parameters' shapes and dtypes: ``warmup`` untimed calls, then TVM's
``time_evaluator`` with ``repeat`` timings of ``number`` calls each. A candidate that
fails to compile, crashes or hangs becomes a result with an ``error``; the next one runs
in a fresh process or session.
"""
from __future__ import annotations

import math
import os
import re
import socket
import statistics
import tempfile
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np
import tvm
from tvm import tirx

from schedules.workers import WorkerPool, error_message
from tvm_ext.host_memory import HostBuffer
from tvm_ext.tir_pipeline import TIR_PIPELINE

SERVER_ID_FUNC = "tvm_ext.rpc_server_id"


@dataclass(frozen=True)
class MeasureInput:
    """One candidate kernel: a complete, scheduled PrimFunc, compiled as ``main``."""

    key: str
    func: tirx.PrimFunc
    target: str | dict | tvm.target.Target


@dataclass
class BuildResult:
    """Where the candidate's shared library is (``artifact``), or why there is none."""

    key: str
    artifact: str | None
    error: str | None
    seconds: float


@dataclass
class MeasureResult:
    """Times of one candidate in ms, one per repeat (each the mean of ``number`` calls)."""

    key: str
    times_ms: list[float]
    error: str | None
    build_s: float
    run_s: float
    device: str = ""  # where it ran: "local", or the RPC server ("host:pid")

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.times_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms) if self.ok else math.inf


def target_spec(target: str | dict | tvm.target.Target) -> str | dict:
    """What ``tvm.target.Target(...)`` takes, in a form that crosses to a worker process."""
    return dict(target.export()) if isinstance(target, tvm.target.Target) else target


def _compile(mod_json: str, target: str | dict, path: str) -> None:
    """Runs in a build worker: one PrimFunc module -> an exported shared library, built by the
    pipeline the compiler builds it with."""
    mod = tvm.ir.load_json(mod_json)
    tvm.compile(mod, target=tvm.target.Target(target), tir_pipeline=TIR_PIPELINE).export_library(path)


class LocalBuilder:
    """Compiles candidates in ``workers`` parallel processes into ``.so`` files in ``workdir``.

    A compile error, a crash or a build over ``timeout_s`` is a ``BuildResult.error``; a
    crashed or stuck worker is replaced. The files live as long as the builder (or in
    ``workdir`` if one is given).
    """

    def __init__(self, workers: int = 2, timeout_s: float = 60, workdir: str | None = None):
        self.timeout_s = timeout_s
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="tvm_ext_build_")
        self.workdir = Path(workdir or self._tmp.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workers = workers
        self.pool = WorkerPool(workers)
        self._count = 0

    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        """One BuildResult per input, in order; never raises for a bad candidate."""
        first, self._count = self._count, self._count + len(inputs)
        jobs = [(inp, self.workdir / f"{first + i}_{_file_safe(inp.key)}.so") for i, inp in enumerate(inputs)]
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(lambda job: self._build_one(*job), jobs))

    def _build_one(self, inp: MeasureInput, path: Path) -> BuildResult:
        start = time.perf_counter()
        try:
            mod_json = tvm.ir.save_json(tvm.IRModule({"main": inp.func}))
            args = (mod_json, target_spec(inp.target), str(path))
        except Exception as err:  # noqa: BLE001 - a malformed candidate is that candidate's error
            return BuildResult(inp.key, None, f"build: {err}", time.perf_counter() - start)
        prepare_s = time.perf_counter() - start
        _, error, call_s = self.pool.call(_compile, args, self.timeout_s)
        seconds = prepare_s + call_s
        if error is not None:
            return BuildResult(inp.key, None, f"build: {error}", seconds)
        return BuildResult(inp.key, str(path), None, seconds)

    def close(self) -> None:
        """Stop the worker processes and delete the built files (unless in a given workdir)."""
        self.pool.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _file_safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:60]


@dataclass(frozen=True)
class Timing:
    """How one candidate is timed (``min_repeat_ms`` raises ``number`` for very fast kernels)."""

    number: int = 3
    repeat: int = 5
    warmup: int = 1
    min_repeat_ms: int = 1


ArgSpec = tuple[tuple[int, ...], str]


def arg_specs(func: tirx.PrimFunc) -> list[ArgSpec]:
    """(shape, dtype) of each parameter; every parameter must be a buffer of static shape."""
    specs = []
    for param in func.params:
        if not isinstance(param.ty, tirx.BufferType):
            raise TypeError(f"parameter {param} is not a buffer: the runner passes tensors only")
        if not all(isinstance(d, tirx.IntImm) for d in param.shape):
            raise ValueError(f"buffer {param.name} has a symbolic shape {list(param.shape)}: bind it first")
        specs.append((tuple(int(d) for d in param.shape), str(param.dtype)))
    return specs


def random_args(specs: list[ArgSpec], dev) -> list:
    """Floats in [0.1, 1) (no NaN from log or sqrt, no division by zero); integers and bools
    zero, so an index input is always in range.

    On this machine each argument is a ``HostBuffer``, page-aligned as the compiled model's
    outputs and workspace are, so a kernel is timed with its buffers placed as in a call.
    Placed by the heap, their offsets in a page changed from one measurement to the next, and
    so did the time: 0.158 to 0.203 ms over six measurements of one softmax kernel (4K
    aliasing, see HostBuffer), 0.157 to 0.160 ms page-aligned."""
    rng = np.random.default_rng(0)
    local = dev.dlpack_device_type() == tvm.cpu(0).dlpack_device_type()
    out = []
    for shape, dtype in specs:
        if "float" in dtype:
            data = rng.uniform(0.1, 1.0, shape).astype(dtype)
        else:
            data = np.zeros(shape, dtype=dtype)
        if local:
            array, tensor = HostBuffer(data.nbytes).template(shape, dtype)
            array[...] = data
            out.append(tensor)
        else:
            out.append(tvm.runtime.tensor(data, dev))
    return out


def time_module(mod, dev, specs: list[ArgSpec], timing: Timing) -> list[float]:
    """Times of ``mod["main"]`` in ms, one per repeat."""
    args = random_args(specs, dev)
    main = mod["main"]
    for _ in range(timing.warmup):
        main(*args)
    evaluator = mod.time_evaluator("main", dev, number=timing.number, repeat=timing.repeat,
                                   min_repeat_ms=timing.min_repeat_ms)
    return [float(s) * 1e3 for s in evaluator(*args).results]


def _time_local(path: str, specs: list[ArgSpec], timing: Timing) -> list[float]:
    """Runs in a LocalRunner worker."""
    return time_module(tvm.runtime.load_module(path), tvm.cpu(0), specs, timing)


class Runner(ABC):
    """Times built candidates; one MeasureResult per input, in order, never raising for a bad one."""

    @abstractmethod
    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        ...

    def close(self) -> None:
        """Stop the runner's worker processes."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _unbuilt(inp: MeasureInput, build: BuildResult) -> MeasureResult | None:
    """The result for a candidate that cannot run (no artifact, bad parameters), else None."""
    if build.key != inp.key:
        raise ValueError(f"builds out of order: input {inp.key!r} got build {build.key!r}")
    if build.error is not None or build.artifact is None:
        return MeasureResult(inp.key, [], build.error or "build: no artifact", build.seconds, 0.0)
    try:
        arg_specs(inp.func)
    except (TypeError, ValueError) as err:
        return MeasureResult(inp.key, [], f"run: {err}", build.seconds, 0.0)
    return None


class LocalRunner(Runner):
    """Times each candidate, one after another, in one reusable subprocess of this machine.

    The subprocess uses ``num_threads`` TVM threads (default: TVM_NUM_THREADS, else all
    cores), as the compiled model does. A candidate over ``timeout_s`` or a crash is its
    error ("timeout after 10 s", "crashed (signal 11, SIGSEGV)"); a new process takes over.
    """

    def __init__(self, timeout_s: float = 10, number: int = 3, repeat: int = 5, warmup: int = 1,
                 min_repeat_ms: int = 1, num_threads: int | None = None):
        self.timeout_s = timeout_s
        self.timing = Timing(number, repeat, warmup, min_repeat_ms)
        self.pool = WorkerPool(1, num_threads)

    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        return [self._run_one(inp, build) for inp, build in zip(inputs, builds, strict=True)]

    def _run_one(self, inp: MeasureInput, build: BuildResult) -> MeasureResult:
        failed = _unbuilt(inp, build)
        if failed is not None:
            return failed
        times, error, run_s = self.pool.call(_time_local, (build.artifact, arg_specs(inp.func), self.timing),
                                             self.timeout_s)
        if error is not None:
            return MeasureResult(inp.key, [], f"run: {error}", build.seconds, run_s, "local")
        return MeasureResult(inp.key, times, None, build.seconds, run_s, "local")

    def close(self) -> None:
        self.pool.close()


def _time_remote(tracker: tuple[str, int], key: str, path: str, specs: list[ArgSpec], timing: Timing,
                 session_timeout: float) -> tuple[list[float], str | None, str]:
    """Runs in an RPCRunner worker: one session, one candidate. Returns (times, error, server)."""
    from tvm import rpc

    session = rpc.connect_tracker(*tracker).request(key, priority=1, session_timeout=session_timeout)
    try:
        server = session.get_function(SERVER_ID_FUNC)()
    except Exception:  # noqa: BLE001 - a server started without rpc_server_init lacks the function
        server = "?"
    try:
        session.upload(path)
        mod = session.load_module(os.path.basename(path))
        return time_module(mod, session.cpu(0), specs, timing), None, server
    except Exception as err:  # noqa: BLE001 - the session's end is the candidate's error
        text = str(err)
        if "RPCSessionTimeoutError" in text:
            return [], f"timeout after {session_timeout:g} s (RPC session expired)", server
        if "kShutdown" in text:
            return [], "crashed (RPC session ended)", server
        return [], error_message(text) or type(err).__name__, server


class RPCRunner(Runner):
    """Times candidates on the servers registered at a TVM RPC tracker under ``key``.

    ``parallel`` local worker processes (default: one per registered server) each take a
    candidate, request a session from the tracker, upload the library and time it there, so
    the candidates spread over the servers. The session's timeout (``timeout_s``) stops a
    hanging kernel on the server; the worker's (``timeout_s + setup_s``) covers a lost server.
    Start servers with ``start_rpc_server`` (or pass ``rpc_server_init`` as their
    ``server_init_callback``) so that a crashing candidate does not end the server.
    """

    def __init__(self, tracker_host: str, tracker_port: int, key: str, timeout_s: float = 10,
                 number: int = 3, repeat: int = 5, warmup: int = 1, min_repeat_ms: int = 1,
                 parallel: int | None = None, setup_s: float = 30):
        self.tracker = (tracker_host, tracker_port)
        self.key = key
        self.timeout_s = timeout_s
        self.setup_s = setup_s
        self.timing = Timing(number, repeat, warmup, min_repeat_ms)
        self.parallel = parallel or max(1, len(self.servers()))
        self.pool = WorkerPool(self.parallel)

    def servers(self) -> list[tuple[str, int]]:
        """Addresses of the servers now registered at the tracker under this key."""
        return self.servers_at(*self.tracker, self.key)

    @staticmethod
    def servers_at(tracker_host: str, tracker_port: int, key: str) -> list[tuple[str, int]]:
        from tvm import rpc

        summary = rpc.connect_tracker(tracker_host, tracker_port).summary()
        return [tuple(s["addr"]) for s in summary["server_info"] if s.get("key") == "server:" + key]

    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        if len(inputs) != len(builds):
            raise ValueError(f"{len(inputs)} inputs but {len(builds)} builds")
        with ThreadPoolExecutor(self.parallel) as pool:
            return list(pool.map(self._run_one, inputs, builds))

    def _run_one(self, inp: MeasureInput, build: BuildResult) -> MeasureResult:
        failed = _unbuilt(inp, build)
        if failed is not None:
            return failed
        if not self.servers():  # else the request would wait for a server until the worker's timeout
            return MeasureResult(inp.key, [], f"run: no RPC server registered at {self.tracker[0]}:{self.tracker[1]} "
                                 f"under key {self.key!r} (a server not started with start_rpc_server stops "
                                 "after a crashed candidate)", build.seconds, 0.0)
        args = (self.tracker, self.key, build.artifact, arg_specs(inp.func), self.timing, self.timeout_s)
        out, error, run_s = self.pool.call(_time_remote, args, self.timeout_s + self.setup_s)
        times, error, server = out if error is None else ([], error, "")
        if error is not None:
            return MeasureResult(inp.key, [], f"run: {error}", build.seconds, run_s, server)
        return MeasureResult(inp.key, times, None, build.seconds, run_s, server)

    def close(self) -> None:
        self.pool.close()


def rpc_server_init() -> None:
    """``server_init_callback`` for ``tvm.rpc.server.Server``: survive crashing candidates.

    TVM 0.27's server raises out of its accept loop when a session's process dies by a
    signal, which ends the server: one segfaulting candidate would take a machine out of
    the tuning run. This wraps the session handler to log that and serve on, and registers
    ``tvm_ext.rpc_server_id`` ("host:pid") so that results say where they ran.
    """
    import tvm_ffi
    from tvm.rpc import server

    ident = f"{socket.gethostname()}:{os.getpid()}"
    tvm_ffi.register_global_func(SERVER_ID_FUNC, lambda: ident, override=True)
    serving = server._serving
    if getattr(serving, "survives_crashes", False):
        return

    def serving_on(sock, addr, opts, load_library):
        cwd = os.getcwd()
        try:
            serving(sock, addr, opts, load_library)
        except RuntimeError as err:  # "Child process ... exited unsuccessfully with error code -11"
            server.logger.warning("session from %s ended: %s; serving on", addr, err)
            os.chdir(cwd)
            sock.close()

    serving_on.survives_crashes = True
    server._serving = serving_on


def start_rpc_server(tracker_host: str, tracker_port: int, key: str, host: str = "0.0.0.0",
                     port: int = 9090, port_end: int = 9199, silent: bool = True):
    """A ``tvm.rpc.server.Server`` (its own process) registered at the tracker, with
    ``rpc_server_init``; call ``.terminate()`` to stop it."""
    from tvm.rpc.server import Server

    return Server(host, port, port_end, tracker_addr=(tracker_host, tracker_port), key=key, silent=silent,
                  server_init_callback=rpc_server_init)


def measure(inputs: list[MeasureInput], builder: LocalBuilder, runner: Runner) -> list[MeasureResult]:
    """Build all candidates, then time them: one MeasureResult per input, in order."""
    return runner.run(inputs, builder.build(inputs))


__all__ = ["BuildResult", "LocalBuilder", "LocalRunner", "MeasureInput", "MeasureResult", "RPCRunner", "Runner",
           "Timing", "arg_specs", "measure", "rpc_server_init", "start_rpc_server"]
