"""Python subprocesses that run function calls for measurement, one call at a time each.

Built on TVM's ``PopenWorker`` (functions go over a pipe with cloudpickle, the child's
timer answers a timeout). What this adds: a call never raises; a crash, a timeout or an
exception comes back as an error string naming the signal or the time, and the dead or
stuck process is replaced by a fresh one on the next call. A second, parent-side timeout
catches a child whose own timer cannot answer. A ``WorkerPool`` shares a few workers
between threads and starts them (1-3 s each, mostly ``import tvm``) in the background.
"""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

from tvm.support.popen_pool import PopenWorker

GRACE_S = 5.0  # the parent waits this long past the child's own timeout before killing it
_CHILD = "import sys; sys.modules['torch'] = None; from tvm.exec.popen_worker import main; main()"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*:")


def _set_num_threads(num_threads: int) -> None:
    """Runs first in every new worker, before TVM starts its thread pool."""
    os.environ["TVM_NUM_THREADS"] = str(num_threads)


def default_num_threads() -> int:
    """TVM_NUM_THREADS if set (as the compiled model uses it), else this process's cores."""
    return int(os.environ.get("TVM_NUM_THREADS") or len(os.sched_getaffinity(0)))


class Worker(PopenWorker):
    """One reusable subprocess; ``call`` returns ``(value, None)`` or ``(None, error)``."""

    def __init__(self, num_threads: int | None = None, maximum_uses: int | None = 200,
                 quiet: bool = True, grace_s: float = GRACE_S):
        out = subprocess.DEVNULL if quiet else None
        super().__init__(_set_num_threads, (num_threads or default_num_threads(),), maximum_uses,
                         stdout=out, stderr=out)
        self.grace_s = grace_s
        self._exit_code: int | None = None

    def _start(self):
        # PopenWorker._start with another child command: the same worker loop, with torch kept
        # out. tvm_ffi imports torch whenever it is installed; that is about 2/3 of a worker's
        # start-up (1.3 s of CPU against 3.8 s here), and kernels never need it.
        if self._proc is not None:
            return
        main_read, worker_write = os.pipe()
        worker_read, main_write = os.pipe()
        self._proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(worker_read), str(worker_write)],
                                      pass_fds=(worker_read, worker_write), stdout=self._stdout, stderr=self._stderr)
        os.close(worker_read)
        os.close(worker_write)
        self._reader = os.fdopen(main_read, "rb")
        self._writer = os.fdopen(main_write, "wb")

    def _child_process_error(self):
        # PopenWorker kills the process here and forgets it: keep how it ended
        try:
            self._exit_code = self._proc.wait(timeout=1.0) if self._proc is not None else None
        except subprocess.TimeoutExpired:  # its pipe closed but it lives on: killed below
            self._exit_code = None
        return super()._child_process_error()

    def call(self, fn: Callable, args: tuple = (), timeout_s: float | None = None) -> tuple[Any, str | None]:
        """Run ``fn(*args)`` in the subprocess within ``timeout_s`` seconds."""
        self._exit_code = None
        if self._proc is not None and not self.is_alive():
            self.kill()  # it died while idle: start afresh instead of blaming this call
        try:
            self.send(fn, args, timeout=timeout_s)  # (re)starts the process first if needed
            if timeout_s is not None and not select.select([self._reader], [], [], timeout_s + self.grace_s)[0]:
                self.kill()
                return None, f"timeout after {timeout_s:g} s"
            return self.recv(), None
        except TimeoutError:
            return None, f"timeout after {timeout_s:g} s"
        except ChildProcessError:
            return None, describe_exit(self._exit_code)
        except Exception as err:  # noqa: BLE001 - the child's exception, carrying its traceback text
            return None, error_message(str(err)) or type(err).__name__

    def close(self) -> None:
        self.kill()


def _ready() -> None:
    """Sent once to a new worker so that it starts (and imports TVM) ahead of the first job."""


class WorkerPool:
    """``size`` workers shared by threads: ``call`` takes an idle one, waiting for one if needed."""

    def __init__(self, size: int, num_threads: int | None = None):
        self.workers = [Worker(num_threads) for _ in range(size)]
        self._idle: SimpleQueue[Worker] = SimpleQueue()
        self._starting = [threading.Thread(target=self._start, args=(w,), daemon=True) for w in self.workers]
        for thread in self._starting:
            thread.start()

    def _start(self, worker: Worker) -> None:
        worker.call(_ready)
        self._idle.put(worker)

    def wait_started(self) -> None:
        """Return once every worker has started (calls do not need this: they wait for a free one)."""
        for thread in self._starting:
            thread.join()

    def call(self, fn: Callable, args: tuple = (), timeout_s: float | None = None) -> tuple[Any, str | None, float]:
        """``(value, error, seconds)``: the seconds count from when a worker was free (they
        include restarting one that a previous call left dead)."""
        worker = self._idle.get()
        start = time.perf_counter()
        try:
            value, error = worker.call(fn, args, timeout_s)
        finally:
            self._idle.put(worker)
        return value, error, time.perf_counter() - start

    def close(self) -> None:
        """Stop every worker process (after those still starting are up, so none is left behind)."""
        self.wait_started()
        for worker in self.workers:
            worker.close()


def describe_exit(code: int | None) -> str:
    """'crashed (signal 11, SIGSEGV)' for a process killed by a signal, else its exit code."""
    if code is not None and code < 0:
        try:
            return f"crashed (signal {-code}, {signal.Signals(-code).name})"
        except ValueError:
            return f"crashed (signal {-code})"
    return f"worker exited (code {code})"


def error_message(text: str, limit: int = 500) -> str:
    """The error itself from a traceback's text: from its last ``SomeError:`` line on."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if _EXCEPTION_LINE.match(line)]
    message = " | ".join(lines[starts[-1] if starts else -1:])
    return message[:limit]
