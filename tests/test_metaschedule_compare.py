"""bench/metaschedule_compare.py: its kernels and side-by-side re-measurement (fast), and its
``--quick`` run end to end (slow: MetaSchedule's part alone took 21-41 s per 8-trial kernel
here, with a small search and the x86-only intrinsics; this one-kernel run took 44-60 s on 2
busy cores, both kernels 112 s)."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from schedules.search_space import apply_candidate, heuristic_candidate
from tvm_ext.models import BUILTIN_MODELS
from tvm_ext.target import host_target
from tvm_ext.tuning import tasks_of

SCRIPT = pathlib.Path(__file__).parent.parent / "bench" / "metaschedule_compare.py"


def _script():
    spec = importlib.util.spec_from_file_location("metaschedule_compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kernels_come_from_the_pipeline_and_remeasure_side_by_side():
    mc = _script()
    target = host_target()
    softmax = mc.kernel_task("softmax", True, target)
    mlp = mc.kernel_task("mlp", True, target)
    assert softmax.name == "fused_softmax" and mlp.name == "fused_matmul_add_relu"
    assert [s for s, _ in mc.arg_specs(mlp.func)] == [(32, 64), (64, 64), (64,), (32, 64)]
    with pytest.raises(ValueError, match="unknown kernel"):
        mc.kernel_task("conv", True, target)

    (original,) = tasks_of(BUILTIN_MODELS["softmax"](128, 256).mod, target=target)
    assert "where=" in original.func.script()  # the vectorizable exp binds its values with Lets
    assert "where=" not in softmax.func.script()  # MetaSchedule's copy has none: the same results
    assert mc.check_outputs({"unscheduled": original.func, "inlined": softmax.func}, target)["inlined"] == 0.0

    heuristic = apply_candidate(mlp.func, mlp.machine, heuristic_candidate(mlp.func, mlp.machine), mlp.name).func
    funcs = {"unscheduled": mlp.func, "heuristic": heuristic}
    diffs = mc.check_outputs(funcs, target)
    assert diffs["unscheduled"] == 0.0 and diffs["heuristic"] < 1e-4
    times = mc.remeasure(funcs, target, rounds=2, repeat=3)
    assert set(times) == set(funcs)
    assert all(len(t) == 2 and all(np.isfinite(v) and v > 0 for v in t) for t in times.values())


@pytest.mark.slow
def test_quick_run_compares_both_tuners(tmp_path):
    out_json = tmp_path / "compare.json"
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--kernels", "mlp", "--json", str(out_json)],
                         check=False, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "MS/ours" in out.stdout and "all four kernels agree" in out.stdout
    data = json.loads(out_json.read_text())
    assert data["meta"]["threads"] >= 1 and data["meta"]["x86_intrinsics_only"]
    (row,) = data["rows"]
    assert row["kernel"] == "mlp" and row["trials"] == 8
    for tuner in ("metaschedule", "ours"):
        assert row[tuner]["trials"] == 8 and row[tuner]["ms"] > 0 and row[tuner]["wall_s"] > 0
    assert row["ratio"] == pytest.approx(row["metaschedule"]["ms"] / row["ours"]["ms"])
    assert row["heuristic_ms"] > 0 and row["unscheduled_ms"] > 0
