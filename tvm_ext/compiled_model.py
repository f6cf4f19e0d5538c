"""The compiled model: call it on arrays, time it, read its report, export and load it."""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax, tirx

from tvm_ext.errors import InputError
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


def signature_of(mod: tvm.IRModule, entry: str = "main") -> list[TensorSpec]:
    specs = []
    for p in mod[entry].params:
        ty = p.ty
        if not isinstance(ty, relax.TensorType):
            raise InputError(f"input '{p.name}' is a {type(ty).__name__}; only tensor inputs are supported")
        dims = tuple(int(d) if isinstance(d, tirx.IntImm) else str(d) for d in ty.shape.values) \
            if isinstance(ty.shape, relax.ShapeExpr) else ()
        specs.append(TensorSpec(p.name, dims, str(ty.dtype)))
    return specs


class CompiledModel:
    """A model compiled for the Relax VM. Call it like a function on numpy arrays."""

    def __init__(self, executable: tvm.runtime.Executable, inputs: Sequence[TensorSpec],
                 report: FusionReport, target: str = ""):
        self.executable = executable
        self.inputs = list(inputs)
        self.target = target
        self.lowered_module: tvm.IRModule | None = None  # set by the pipeline, for inspection
        self._report = report
        self._device = tvm.cpu(0)
        self._vm = relax.VirtualMachine(executable, self._device)

    # ------------------------------------------------------------------ running
    def __call__(self, *args: Any) -> Any:
        """Run on numpy arrays (or torch / TVM tensors); returns numpy arrays."""
        return _to_numpy(self._vm["main"](*self._device_args(args)))

    def _device_args(self, args: Sequence[Any]) -> list:
        if len(args) != len(self.inputs):
            expected = ", ".join(str(s) for s in self.inputs)
            raise InputError(f"expected {len(self.inputs)} inputs ({expected}), got {len(args)}")
        return [self._check(spec, i, a) for i, (spec, a) in enumerate(zip(self.inputs, args))]

    def _check(self, spec: TensorSpec, i: int, arg: Any):
        if isinstance(arg, tvm.runtime.Tensor):
            shape, dtype = tuple(arg.shape), str(arg.dtype)
            tensor = arg
        else:
            array = np.asarray(arg.detach().cpu().numpy() if hasattr(arg, "detach") else arg)
            shape, dtype = array.shape, str(array.dtype)
            tensor = None
        if len(shape) != len(spec.shape) or any(isinstance(d, int) and d != s for d, s in zip(spec.shape, shape)):
            raise InputError(f"input '{spec.name}' (argument {i}) must have shape {list(spec.shape)}, "
                             f"got {list(shape)}")
        if dtype != spec.dtype:
            raise InputError(f"input '{spec.name}' (argument {i}) must be {spec.dtype}, got {dtype}; "
                             f"convert it with .astype('{spec.dtype}')")
        return tensor if tensor is not None else tvm.runtime.tensor(np.asarray(array, order="C"), self._device)

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
        """Median of ``repeat`` timings, each the mean of ``number`` calls (after one warm-up)."""
        tensors = self._device_args(args or self.random_inputs())
        evaluator = self._vm.time_evaluator("main", self._device, number=number, repeat=repeat,
                                            min_repeat_ms=min_repeat_ms)
        times = [t * 1e3 for t in evaluator(*tensors).results]
        return BenchmarkResult(statistics.median(times), statistics.fmean(times), min(times),
                               statistics.pstdev(times), len(times))

    # ------------------------------------------------------------------ inspection
    def report(self) -> FusionReport:
        """One line per kernel: its ops, fuse pattern, bytes read and written."""
        return self._report

    # ------------------------------------------------------------------ export / load
    def export(self, path: str | os.PathLike) -> None:
        """Write the shared library to ``path`` and its signature and report to ``path.json``."""
        path = os.fspath(path)
        self.executable.export_library(path)
        meta = {"inputs": [asdict(s) for s in self.inputs], "report": self._report.to_dict(),
                "target": self.target}
        with open(path + ".json", "w") as f:
            json.dump(meta, f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CompiledModel":
        """Load what ``export`` wrote."""
        path = os.fspath(path)
        with open(path + ".json") as f:
            meta = json.load(f)
        executable = tvm.runtime.load_module(path)
        inputs = [TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in meta["inputs"]]
        return cls(executable, inputs, FusionReport.from_dict(meta["report"]), meta.get("target", ""))


def _to_numpy(value: Any) -> Any:
    if isinstance(value, tvm.runtime.Tensor):
        return value.numpy()
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        items = [_to_numpy(v) for v in value]
        return items[0] if len(items) == 1 else tuple(items)
    return value
