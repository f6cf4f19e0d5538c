"""The compiled model: call it on arrays, time it, read its report, export and load it."""
from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx

from relay_passes.plan_memory import PLANNED_ENTRY, RELEASE, PlannedEntry
from tvm_ext.errors import InputError, ModelFileError
from tvm_ext.host_memory import BufferPool, block_size
from tvm_ext.report import FusionReport


@dataclass(frozen=True)
class TensorSpec:
    """One input of the compiled function; a str dim is symbolic (any size)."""

    name: str
    shape: tuple
    dtype: str

    def __str__(self) -> str:
        return f"{self.name}: {list(self.shape)} {self.dtype}"


@dataclass(frozen=True)
class BenchmarkResult:
    """Times of repeated runs, in milliseconds; compare medians."""

    median_ms: float
    mean_ms: float
    min_ms: float
    std_ms: float
    runs: int

    def __str__(self) -> str:
        return f"median {self.median_ms:.3f} ms (min {self.min_ms:.3f}, std {self.std_ms:.3f}, {self.runs} runs)"

    @classmethod
    def of(cls, times_ms: Sequence[float]) -> "BenchmarkResult":
        return cls(statistics.median(times_ms), statistics.fmean(times_ms), min(times_ms),
                   statistics.pstdev(times_ms), len(times_ms))


def time_calls(fn: Callable[[], Any], number: int = 10, repeat: int = 7) -> BenchmarkResult:
    """Median of ``repeat`` timings, each the mean of ``number`` calls of ``fn`` (after one
    warm-up): a call as its users make it, conversions included."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number * 1e3)
    return BenchmarkResult.of(times)


def signature_of(mod: tvm.IRModule, entry: str = "main") -> list[TensorSpec]:
    """The inputs of ``entry``, in order."""
    specs = []
    for p in mod[entry].params:
        ty = p.ty
        if not isinstance(ty, relax.TensorType):
            raise InputError(f"input '{p.name}' is a {type(ty).__name__}; only tensor inputs are supported")
        dims = tuple(int(d) if isinstance(d, tirx.IntImm) else str(d) for d in ty.shape.values) \
            if isinstance(ty.shape, relax.ShapeExpr) else ()
        specs.append(TensorSpec(p.name, dims, str(ty.dtype)))
    return specs


def dim_bounds_of(mod: tvm.IRModule, entry: str = "main") -> dict[str, tuple]:
    """The range of each symbolic dim of ``entry`` that its importer recorded (torch.export's
    ``Dim(min=, max=)``): {dim: (lowest, highest)}, None for an open end."""
    attrs = mod[entry].attrs or {}
    low, high = ({str(k): int(v) for k, v in (attrs[key] if key in attrs else {}).items()}
                 for key in ("tir_var_lower_bound", "tir_var_upper_bound"))
    return {n: (low.get(n), high.get(n)) for n in sorted(low.keys() | high.keys())}


class CompiledModel:
    """A model compiled for the Relax VM. Call it like a function on numpy arrays.

    The call costs little more than its kernels: inputs go in through DLPack without a copy
    (C-contiguous numpy arrays, torch tensors, TVM tensors); the intermediates live in one
    workspace planned by PlanMemory and allocated once per thread; outputs are written into
    pooled buffers (``tvm_ext.host_memory``) that come back to the caller without a copy:
    numpy arrays for numpy inputs, torch tensors for torch inputs, TVM tensors for TVM
    tensors. A buffer is reused once the caller drops every array made from it. Each thread
    that calls gets its own VM and workspace (the Relax VM is not re-entrant). A model with
    symbolic shapes calls ``main`` instead, with the VM's own outputs shared through DLPack.
    """

    def __init__(self, executable: tvm.runtime.Executable, inputs: Sequence[TensorSpec],
                 report: FusionReport, target: str = "", entry: PlannedEntry | None = None,
                 outputs: Sequence[TensorSpec] = (), dim_bounds: dict[str, tuple] | None = None,
                 devices: Sequence[str] = ()):
        self.executable = executable
        self.devices = list(devices)  # PlaceDevice's devices in VDevice order ("cpu:0" first); [] = one
        self.dim_bounds = {d: tuple(b) for d, b in (dim_bounds or {}).items()}
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.target = target
        usable = entry is not None and _numpy_dtypes(entry) and len(entry.returned) == len(self.outputs)
        self.entry = entry if usable else None
        self.lowered_module: tvm.IRModule | None = None  # set by the pipeline, for inspection
        self._report = report
        self._device = tvm.cpu(0)
        self._local = threading.local()  # per thread: its VM, entry, pool of buffers, workspace
        self._symbolic = any(isinstance(d, str) for s in self.inputs for d in s.shape)
        # per destination (shape, dtype, pool block size); per output, the destination it is
        # all of (possibly reshaped or re-typed), or None when it is copied from the VM's result
        entry = self.entry
        self._dests = [(tuple(sh), dt, block_size(tuple(sh), dt)) for sh, dt in entry.outputs] if entry else []
        self._leaf_dest = [d if d is not None and _same_bytes(spec, *entry.outputs[d]) else None
                           for d, spec in zip(entry.returned, self.outputs)] if entry else []
        try:  # what _numpy_fast_path compares against
            self._fast = None if self._symbolic else [
                (tuple(s.shape), np.dtype(s.dtype), np.dtype(s.dtype).itemsize) for s in self.inputs]
        except TypeError:  # a dtype numpy lacks (bfloat16): always the full checks
            self._fast = None
        # every output is a whole destination of its own shape and dtype: a numpy call returns
        # the pooled arrays themselves (``_call_direct``)
        self._direct = self._fast is not None and entry is not None and all(
            d is not None and tuple(entry.outputs[d][0]) == tuple(spec.shape) and entry.outputs[d][1] == spec.dtype
            for d, spec in zip(entry.returned, self.outputs))

    # ------------------------------------------------------------------ running
    def __call__(self, *args: Any, out: Any = None) -> Any:
        """Run on numpy arrays (or torch / TVM tensors); returns arrays of the same kind.

        ``out`` (an array, or a tuple with one per output) receives the results in buffers the
        caller owns; they are returned.
        """
        if self._direct:
            if out is None:
                call = getattr(self._local, "direct", None) or self._make_direct()
                result = call(args)
                if result is not None:
                    return result
            else:
                tensors = self._numpy_fast_path(args)
                given = None if tensors is None else self._numpy_out(out, args)
                if given is not None:
                    self._call_direct(tensors, given)
                    return out
        tensors, kind = self._device_args(args)
        run, release, workspace = self._runner()
        if self.entry is None:
            result = run(*tensors)
            release()
            leaves = list(result) if _is_array(result) else [result]
        else:
            dests, owned = self._destinations(out, args)  # owned: our pooled arrays, held through the call
            result = run(*tensors, workspace, *dests)
            release()
            leaves = list(result) if _is_array(result) else [result]
            if out is None:  # the pooled arrays themselves go back, viewed in each output's shape
                values = [_export(leaf, kind, copy=True) if d is None else
                          _wrap(_as_leaf(owned[d], spec), kind) if isinstance(leaf, tvm.runtime.Tensor) else
                          _export(leaf, kind, copy=False)
                          for leaf, d, spec in zip(leaves, self._leaf_dest, self.outputs)]
                return values[0] if len(values) == 1 else tuple(values)
        if out is not None:
            return self._into(out, leaves)
        values = [_export(leaf, kind, copy=False) for leaf in leaves]
        return values[0] if len(values) == 1 else tuple(values)

    def _make_direct(self) -> Callable[[tuple], Any]:
        """This thread's call for the common case, numpy in and out with nothing to reshape: the
        kernels write pooled arrays, which are returned. None (from the call) sends arguments
        it does not take as they are through the full checks.

        Everything is bound once, so a call is a few attribute reads: what runs between two
        kernel calls finds the caches emptied by the kernels' traffic, and each object it touches
        costs a miss (about 35 us for the general path against 12 after a 24 MiB softmax).
        Each destination first tries the block this thread last lent for it; the blocks of a
        thread's pool are never lent to another thread, so nothing can take it in between."""
        run, release, workspace = self._runner()
        pool = self._local.pool
        ndarray, getrefcount, from_dlpack = np.ndarray, sys.getrefcount, tvm_ffi.from_dlpack
        specs = [(shape, dtype, itemsize, _compact_strides(shape, itemsize)) for shape, dtype, itemsize in self._fast]
        dests = self._dests
        slots: list = [None] * len(dests)  # per destination: (block, its array template, its tensor)
        returned = self.entry.returned
        count = len(specs)

        def lend(d: int) -> tuple:
            shape, dtype, size = dests[d]
            block = pool.take_block(size)
            template, tensor = block.template(shape, dtype)
            slots[d] = (block, template, tensor)
            return template.view(), tensor

        def call(args: tuple) -> Any:
            if len(args) != count:
                return None
            tensors = []
            for arg, (shape, dtype, itemsize, strides) in zip(args, specs):
                if type(arg) is not ndarray or arg.shape != shape or arg.strides != strides or arg.dtype != dtype:
                    return None
                try:  # refuses read-only (BufferError) and misaligned (RuntimeError) arrays
                    tensors.append(from_dlpack(arg, require_alignment=itemsize))
                except (BufferError, RuntimeError, ValueError):
                    return None
            owned = []
            for d, slot in enumerate(slots):
                if slot is not None and getrefcount(slot[0].root) <= slot[0].idle_refs:
                    owned.append(slot[1].view())
                    tensors.append(slot[2])
                else:
                    array, tensor = lend(d)
                    owned.append(array)
                    tensors.append(tensor)
            tensors.insert(count, workspace)
            run(*tensors)
            release()
            return owned[returned[0]] if len(returned) == 1 else tuple(owned[d] for d in returned)

        self._local.direct = call
        return call

    def _call_direct(self, tensors: list, given: dict) -> None:
        """The kernels into the caller's numpy arrays (``given``: destination -> tensor), pooled
        arrays for the other destinations."""
        run, release, workspace = self._runner()
        take = self._pool.take_sized
        dests = []
        for d, (shape, dtype, size) in enumerate(self._dests):
            dests.append(given[d] if d in given else take(size, shape, dtype)[1])
        run(*tensors, workspace, *dests)
        release()

    def _numpy_out(self, out: Any, args: Sequence[Any]) -> dict | None:
        """``out`` as destination tensors when it is one C-contiguous, writeable numpy array
        per output, of exactly its shape and dtype, each its own destination and apart from the
        inputs; None sends the call through ``_out_buffers``, which says what is wrong."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        returned = self.entry.returned
        if len(outs) != len(self.outputs) or len(set(returned)) != len(returned):
            return None
        given = {}
        for buf, d, spec in zip(outs, returned, self.outputs):
            if (type(buf) is not np.ndarray or buf.shape != self._dests[d][0] or buf.dtype != spec.dtype
                    or not buf.flags.c_contiguous or not buf.flags.writeable or not buf.size
                    or any(np.may_share_memory(buf, arg) for arg in args)):
                return None
            try:
                given[d] = tvm_ffi.from_dlpack(buf, require_alignment=buf.itemsize)
            except Exception:  # noqa: BLE001 - misaligned: the full path copies
                return None
        return given

    @property
    def _pool(self) -> BufferPool:
        """This thread's buffers (outputs and workspace): a block is lent to one thread only."""
        self._runner()
        return self._local.pool

    def _runner(self) -> tuple[Any, Any, Any]:
        """This thread's entry function, register release and workspace, made on its first
        call (with the thread's own VM)."""
        runner = getattr(self._local, "runner", None)
        if runner is None:
            vm = relax.VirtualMachine(self.executable, [_runtime_device(d) for d in self.devices]
                                      if self.devices else self._device)
            self._local.vm = vm
            self._local.pool = BufferPool()
            workspace = None
            if self.entry is not None:
                self._local.workspace, workspace = self._local.pool.take((self.entry.workspace_bytes,), "uint8")
            run = vm[PLANNED_ENTRY if self.entry is not None else "main"]
            runner = self._local.runner = (run, vm[RELEASE], workspace)
        return runner

    def _destinations(self, out: Any, args: Sequence[Any]) -> tuple[list, list]:
        """One tensor per destination of ``main_planned``: the caller's ``out`` buffer where a
        returned output is exactly that destination, else a pooled buffer."""
        dests: list = [None] * len(self._dests)
        if out is not None:
            given = self._out_buffers(out, args)
            for buf, d in zip(given, self._leaf_dest):
                if d is not None and dests[d] is None:
                    dests[d] = tvm_ffi.from_dlpack(_as_numpy_view(buf).reshape(self._dests[d][0]),
                                                   require_alignment=1)
        owned: list = [None] * len(dests)
        for d, (shape, dtype, size) in enumerate(self._dests):
            if dests[d] is None:
                owned[d], dests[d] = self._pool.take_sized(size, shape, dtype)
        return dests, owned

    def _out_buffers(self, out: Any, args: Sequence[Any]) -> list:
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(self.outputs):
            raise InputError(f"out= must hold {len(self.outputs)} buffers "
                             f"({', '.join(str(s) for s in self.outputs)}), got {len(outs)}")
        for i, (spec, buf) in enumerate(zip(self.outputs, outs)):
            shape, dtype, contiguous, writeable = _describe(buf)
            where = f"out[{i}] (output '{spec.name}')"
            if tuple(shape) != tuple(spec.shape) or dtype != spec.dtype:
                raise InputError(f"{where} must be a {spec.dtype} array of shape {list(spec.shape)}, "
                                 f"got {dtype} {list(shape)}; allocate it with "
                                 f"np.empty({tuple(spec.shape)}, '{spec.dtype}')")
            if not contiguous:
                raise InputError(f"{where} is not C-contiguous; pass np.empty(...) or np.ascontiguousarray(...)")
            if not writeable:
                raise InputError(f"{where} is read-only; pass a writeable array")
            for j, arg in enumerate(args):
                if _overlaps(buf, arg):
                    raise InputError(f"{where} shares memory with input '{self.inputs[j].name}'; "
                                     f"the kernels would overwrite it while reading it. Pass a separate buffer")
        return outs

    def _into(self, out: Any, leaves: list) -> Any:
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        for buf, leaf in zip(outs, leaves):
            src = np.from_dlpack(leaf)
            dst = _as_numpy_view(buf)
            if src.ctypes.data != dst.ctypes.data:
                np.copyto(dst, src.reshape(dst.shape))
        return out

    def _device_args(self, args: Sequence[Any]) -> tuple[list, str]:
        if len(args) != len(self.inputs):
            expected = ", ".join(str(s) for s in self.inputs)
            raise InputError(f"expected {len(self.inputs)} inputs ({expected}), got {len(args)}")
        tensors = self._numpy_fast_path(args)
        if tensors is not None:
            return tensors, "numpy"
        kinds = set()
        dims: dict = {}
        tensors = []
        for i, (spec, arg) in enumerate(zip(self.inputs, args)):
            tensor, kind = self._check(spec, i, arg, dims)
            tensors.append(tensor)
            kinds.add(kind)
        kind = kinds.pop() if len(kinds) == 1 else "numpy"
        return tensors, kind

    def _numpy_fast_path(self, args: Sequence[Any]) -> list | None:
        """The inputs as TVM tensors when all are C-contiguous numpy arrays of exactly the
        static shape and dtype (the common call, checked with a few attribute reads); None
        sends the call through the full checks."""
        if self._fast is None or len(args) != len(self._fast):
            return None
        tensors = []
        for arg, (shape, dtype, itemsize) in zip(args, self._fast):
            if (type(arg) is not np.ndarray or arg.shape != shape or arg.dtype != dtype or not arg.flags.c_contiguous
                    or not arg.size):
                return None
            try:
                tensors.append(tvm_ffi.from_dlpack(arg, require_alignment=itemsize))
            except Exception:  # noqa: BLE001 - misaligned or read-only: the full checks say what to do
                return None
        return tensors

    def _check(self, spec: TensorSpec, i: int, arg: Any, dims: dict) -> tuple[Any, str]:
        where = f"input '{spec.name}' (argument {i})"
        if isinstance(arg, tvm.runtime.Tensor):
            kind, array, shape, dtype = "tvm", None, tuple(arg.shape), str(arg.dtype)
        elif _is_torch(arg):
            if arg.device.type != "cpu":
                raise InputError(f"{where} is on {arg.device}; this model runs on the CPU, pass x.cpu()")
            kind, array, shape, dtype = "torch", arg.detach(), tuple(arg.shape), str(arg.dtype).replace("torch.", "")
        else:
            array = arg if isinstance(arg, np.ndarray) else np.asarray(arg)
            kind, shape, dtype = "numpy", array.shape, str(array.dtype)
        if len(shape) != len(spec.shape) or any(isinstance(d, int) and d != s for d, s in zip(spec.shape, shape)):
            raise InputError(f"{where} must have shape {list(spec.shape)}, got {list(shape)}")
        if self._symbolic:
            for d, s in zip(spec.shape, shape):
                if isinstance(d, str) and dims.setdefault(d, s) != s:
                    raise InputError(f"{where}: dim '{d}' is {s} here but {dims[d]} in an earlier input; "
                                     f"inputs that share a dim must agree on its size")
                low, high = self.dim_bounds.get(d, (None, None)) if isinstance(d, str) else (None, None)
                if (low is not None and s < low) or (high is not None and s > high):
                    raise InputError(f"{where}: dim '{d}' is {s}, outside the range [{low}, {high}] the model "
                                     f"was exported for (torch.export's Dim(min=, max=)); export it with a wider range")
        if dtype != spec.dtype:
            fix = f".to(torch.{spec.dtype})" if kind == "torch" else f".astype('{spec.dtype}')"
            raise InputError(f"{where} must be {spec.dtype}, got {dtype}; convert it with {fix}")
        if kind == "tvm":
            return arg, kind
        if not math.prod(shape):  # no data: DLPack's strides of an empty array are not TVM's compact ones
            return tvm.runtime.empty(tuple(shape), spec.dtype, self._device), kind
        if kind == "torch":
            if not array.is_contiguous():
                raise InputError(f"{where} is not contiguous; pass x.contiguous()")
            return tvm_ffi.from_dlpack(array, require_alignment=array.element_size()), kind
        if not array.flags.c_contiguous:
            raise InputError(f"{where} is not C-contiguous (a transposed or strided view); "
                             f"pass np.ascontiguousarray(x)")
        if array.ctypes.data % max(1, array.itemsize) or not array.flags.writeable:
            array = array.copy()  # DLPack exports neither misaligned nor read-only arrays
        return tvm_ffi.from_dlpack(array, require_alignment=max(1, array.itemsize)), kind

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Inputs matching the signature (symbolic dims set to 1), for timing and smoke tests."""
        rng = np.random.default_rng(seed)
        out = []
        for spec in self.inputs:
            shape = tuple(d if isinstance(d, int) else 1 for d in spec.shape)
            if spec.dtype.startswith("float"):
                out.append(rng.standard_normal(shape).astype(spec.dtype))
            elif spec.dtype == "bool":
                out.append(rng.random(shape) < 0.5)
            else:
                out.append(rng.integers(0, 8, shape).astype(spec.dtype))
        return out

    def benchmark(self, *args: Any, number: int = 10, repeat: int = 7,
                  min_repeat_ms: int = 0) -> BenchmarkResult:
        """Kernels only: median of ``repeat`` timings, each the mean of ``number`` calls (after
        one warm-up), on arguments converted beforehand. A user's call also converts its
        arguments and results; time ``compiled(x)`` itself to see that."""
        tensors, _ = self._device_args(args or self.random_inputs())
        _, _, workspace = self._runner()
        vm = self._local.vm
        if self.entry is None:
            name, call_args = "main", tensors
        else:
            dests, self._bench_outputs = self._destinations(None, args)
            name, call_args = PLANNED_ENTRY, [*tensors, workspace, *dests]
        evaluator = vm.time_evaluator(name, self._device, number=number, repeat=repeat,
                                      min_repeat_ms=min_repeat_ms)
        return BenchmarkResult.of([t * 1e3 for t in evaluator(*call_args).results])

    def time_call(self, *args: Any, number: int = 10, repeat: int = 7) -> BenchmarkResult:
        """The user's call, ``self(*args)``, timed as ``time_calls`` does: conversions of the
        arguments and results included. Compare it with a peer's call timed the same way."""
        args = args or tuple(self.random_inputs())
        return time_calls(lambda: self(*args), number, repeat)

    # ------------------------------------------------------------------ inspection
    def report(self) -> FusionReport:
        """One line per kernel: its ops, fuse pattern, bytes read and written; and the memory plan."""
        return self._report

    # ------------------------------------------------------------------ export / load
    def export(self, path: str | os.PathLike) -> None:
        """Write the shared library to ``path`` and its signature, report, calling convention
        and a checksum of both to ``path.json``."""
        path = os.fspath(path)
        self.executable.export_library(path)
        meta = {"inputs": [asdict(s) for s in self.inputs], "outputs": [asdict(s) for s in self.outputs],
                "report": self._report.to_dict(), "target": self.target,
                "entry": self.entry.to_dict() if self.entry is not None else None,
                "dim_bounds": {d: list(b) for d, b in self.dim_bounds.items()}, "devices": self.devices}
        meta["checksum"] = _checksum(path, meta)
        with open(path + ".json", "w") as f:
            json.dump(meta, f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CompiledModel":
        """Load what ``export`` wrote. The checksum is checked before the library is loaded: a
        truncated or altered library would crash the process, an edited signature mislead it."""
        path = os.fspath(path)
        try:
            with open(path + ".json") as f:
                meta = json.load(f)
        except FileNotFoundError as err:
            raise ModelFileError(f"{path}.json is missing; export writes it beside {path}: "
                                 f"export the model again") from err
        except json.JSONDecodeError as err:
            raise ModelFileError(f"{path}.json is not valid JSON ({err.msg} at line {err.lineno}); "
                                 f"it was truncated or edited: export the model again") from err
        if not os.path.exists(path):
            raise ModelFileError(f"{path}, the library that {path}.json describes, is missing: "
                                 f"export the model again")
        expected = meta.pop("checksum", None)
        if expected is None or _checksum(path, meta) != expected:
            raise ModelFileError(f"{path} or {path}.json was changed since export (checksum mismatch"
                                 f"{'' if expected else ': none recorded'}); loading it could crash or compute "
                                 f"on the wrong shapes. Export the model again")
        executable = tvm.runtime.load_module(path)
        inputs = [TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in meta["inputs"]]
        outputs = [TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in meta.get("outputs", [])]
        entry = PlannedEntry.from_dict(meta["entry"]) if meta.get("entry") else None
        return cls(executable, inputs, FusionReport.from_dict(meta["report"]), meta.get("target", ""),
                   entry=entry, outputs=outputs, dim_bounds=meta.get("dim_bounds"), devices=meta.get("devices", []))


def _compact_strides(shape: tuple, itemsize: int) -> tuple:
    """The strides, in bytes, of a C-contiguous array of ``shape`` (numpy's, for a fresh array)."""
    return tuple(itemsize * math.prod(shape[i + 1:]) for i in range(len(shape)))


def _runtime_device(name: str) -> tvm.runtime.Device:
    """``"cpu:1"`` as TVM's device."""
    kind, _, index = name.partition(":")
    return tvm.runtime.device(kind, int(index or 0))


def _checksum(library: str, meta: dict) -> str:
    """SHA-256 of the library's bytes and of the metadata (canonical JSON, checksum excluded)."""
    digest = hashlib.sha256()
    with open(library, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    digest.update(json.dumps(meta, sort_keys=True).encode())
    return digest.hexdigest()


def outputs_of(mod: tvm.IRModule, entry: str = "main") -> list[TensorSpec]:
    """The returned tensors of ``entry`` (a tuple's fields, or the one tensor)."""
    ty = mod[entry].ret_ty
    fields = list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]
    specs = []
    for i, f in enumerate(fields):
        if isinstance(f, relax.TensorType) and isinstance(f.shape, relax.ShapeExpr):
            dims = tuple(int(d) if isinstance(d, tirx.IntImm) else str(d) for d in f.shape.values)
            specs.append(TensorSpec(f"output{i}", dims, str(f.dtype)))
        else:
            specs.append(TensorSpec(f"output{i}", (), str(getattr(f, "dtype", "?"))))
    return specs


def _numpy_dtypes(entry: PlannedEntry) -> bool:
    """Whether every destination can be a pooled numpy array that DLPack exports."""
    try:
        for _, dtype in entry.outputs:
            np.empty(1, np.dtype(dtype)).__dlpack__()
    except (TypeError, BufferError):  # bfloat16 (unknown, or ml_dtypes' that DLPack refuses):
        return False  # the VM allocates those outputs itself
    return True


def _is_array(value: Any) -> bool:
    return isinstance(value, (list, tuple)) or type(value).__name__ == "Array"


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _nbytes_of(shape: tuple, dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * tvm.DataType(dtype).bits // 8


def _same_bytes(spec: TensorSpec, shape: tuple, dtype: str) -> bool:
    try:
        return _nbytes(spec) == _nbytes_of(shape, dtype)
    except (TypeError, ValueError):  # not a tensor (a nested tuple's spec)
        return False


def _nbytes(spec: TensorSpec) -> int:
    return -1 if any(isinstance(d, str) for d in spec.shape) else _nbytes_of(spec.shape, spec.dtype)


def _describe(buf: Any) -> tuple[tuple, str, bool, bool]:
    if isinstance(buf, tvm.runtime.Tensor):
        return tuple(buf.shape), str(buf.dtype), True, True
    if _is_torch(buf):
        return tuple(buf.shape), str(buf.dtype).replace("torch.", ""), buf.is_contiguous(), True
    if isinstance(buf, np.ndarray):
        return buf.shape, str(buf.dtype), buf.flags.c_contiguous, buf.flags.writeable
    raise InputError(f"out= takes numpy arrays, torch tensors or TVM tensors, got {type(buf).__name__}")


def _as_numpy_view(buf: Any) -> np.ndarray:
    return buf if isinstance(buf, np.ndarray) else np.from_dlpack(buf)


def _overlaps(buf: Any, arg: Any) -> bool:
    try:
        return np.may_share_memory(_as_numpy_view(buf), _as_numpy_view(arg))
    except (TypeError, BufferError, RuntimeError, ValueError):
        return False


def _as_leaf(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """A destination array seen as the output it holds (a reshape or re-typed view of it)."""
    if array.shape == spec.shape and array.dtype.name == spec.dtype:
        return array
    return array.reshape(-1).view(spec.dtype).reshape(spec.shape)


def _wrap(array: np.ndarray, kind: str) -> Any:
    """One of our pooled arrays as the caller's kind (sharing its memory)."""
    if kind == "torch":
        import torch

        return torch.from_numpy(array)
    if kind == "tvm":
        return tvm_ffi.from_dlpack(array, require_alignment=1)
    return array


def _export(value: Any, kind: str, copy: bool) -> Any:
    """A VM result as the caller's kind of array, sharing its memory unless ``copy``."""
    if _is_array(value):  # a nested tuple; one of one item is that item, as at the top level
        items = [_export(v, kind, copy) for v in value]
        return items[0] if len(items) == 1 else tuple(items)
    if not isinstance(value, tvm.runtime.Tensor):
        return value
    if kind == "tvm":
        return value.copyto(tvm.cpu(0)) if copy else value
    if kind == "torch":
        import torch

        t = torch.from_dlpack(value)
        return t.clone() if copy else t
    try:
        array = np.from_dlpack(value)
    except (TypeError, BufferError, RuntimeError):  # a dtype numpy lacks (bfloat16)
        return value.numpy()
    return array.copy() if copy else array
