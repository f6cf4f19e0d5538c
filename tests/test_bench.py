"""The benchmark script runs end to end (a small smoke run; the figures come from full runs)."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).parent.parent / "bench" / "run.py"


def test_bench_quick_run_writes_ratios(tmp_path):
    out_json = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, str(BENCH), "--quick", "--models", "elementwise_chain,mlp",
                          "--repeat", "1", "--no-torch-compile", "--json", str(out_json)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "vs TVM" in out.stdout and "geomean" in out.stdout and "compile time" in out.stdout
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["model"] for r in rows] == ["elementwise_chain", "mlp"]
    for r in rows:
        assert r["ok"] and r["tvm_ms"] > 0 and r["eager_ms"] > 0
        assert set(r["ours_ms"]) == {"autofuse", "nnvm"} and min(r["ours_ms"].values()) > 0
        assert set(r["build_s"]) == {"autofuse", "nnvm"} and min(r["build_s"].values()) > 0
    assert rows[0]["x_roof"] > 0 and rows[1]["x_roof"] is None  # a roofline for memory-bound work only


def test_rounds_rotate_their_order_and_pairs_give_the_median_ratio(monkeypatch):
    sys.path.insert(0, str(BENCH.parent))
    import run

    monkeypatch.setattr(run, "_POOL_SETTLE_S", 0.0)
    order = []
    # call, kernels, kernels, call; then kernels, call, call, kernels...: ratios 2, 3, 3
    calls = iter([4.0, 2.0, 2.0, 4.0, 3.0, 9.0, 9.0, 3.0, 6.0, 2.0, 2.0, 6.0])

    def timer(name, value=1.0):
        return lambda: (order.append(name), value)[1]
    pair = run.paired(lambda: (order.append("ours"), next(calls))[1],
                      lambda: (order.append("kernels"), next(calls))[1])
    ms = run.interleaved_medians({"ours": pair, "a": timer("a"), "b": timer("b")}, repeat=3)
    abba, baab = ["ours", "kernels", "kernels", "ours"], ["kernels", "ours", "ours", "kernels"]
    assert order == [*abba, "a", "b", "a", "b", *baab, "b", *abba, "a"]
    assert ms["ours"] == (6.0, 2.0, 3.0) and ms["a"] == 1.0


def test_every_workload_builds_its_module_and_input():
    sys.path.insert(0, str(BENCH.parent))
    import torch
    from models import workloads

    table = workloads(quick=True)
    assert {"mish", "group_norm_silu", "matmul_512", "conv_bn_relu", "inverted_residual",
            "inverted_residual_s2", "transformer_encoder_layer"} <= set(table)
    for name, workload in table.items():
        module, x = workload.make()
        with torch.no_grad():
            assert module.eval()(x).shape[0] == x.shape[0], name


def test_bench_tunes_against_a_second_build_for_another_cpu(tmp_path):
    # --tune times the tuned build against the untuned one, and a second untuned build as the
    # control; --mcpu haswell builds AVX2 code, which both CPU kinds we run on (AVX-512, Zen 3) execute
    out_json = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, str(BENCH), "--quick", "--models", "elementwise_chain", "--fusion", "autofuse",
                          "--repeat", "1", "--no-torch-compile", "--no-onnxruntime", "--tune", "2", "--mcpu", "haswell",
                          "--tuning-db", str(tmp_path / "db.jsonl"), "--json", str(out_json)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "mcpu=haswell" in out.stdout and "a second untuned build" in out.stdout
    result = json.loads(out_json.read_text())
    (row,) = result["rows"]
    assert result["mcpu"] == "haswell" and row["ok"]
    assert row["tuned_ms"] > 0 and row["tuned_vs_untuned"] > 0 and row["rebuilt_vs_untuned"] > 0


def test_each_timed_compile_starts_right_after_a_full_collection(monkeypatch):
    """Ours (import, then each strategy's compile) and ORT's session each begin right after
    ``collected``, so that no full collection due from earlier work falls inside one of them."""
    sys.path.insert(0, str(BENCH.parent))
    import run
    from models import workloads

    events = []
    monkeypatch.setattr(run, "collected", lambda: events.append("collected"))
    monkeypatch.setattr(run, "interleaved_medians", lambda timers, *a, **k: {
        n: (1.0, 1.0, 1.0) if n.startswith("ours") else 1.0 for n in timers})
    for name, wrapped in (("from_torch", "import"), ("onnxruntime_session", "ort")):
        real = getattr(run, name)
        monkeypatch.setattr(run, name, lambda *a, _real=real, _label=wrapped, **k: (events.append(_label),
                                                                                  _real(*a, **k))[1])
    real_compile = run.tvm_ext.compile
    monkeypatch.setattr(run.tvm_ext, "compile", lambda *a, **k: (events.append("compile"), real_compile(*a, **k))[1])
    run.bench_one("elementwise_chain", workloads(quick=True)["elementwise_chain"], 1, ["autofuse", "nnvm"],
                  with_compile=False)
    timed = [e for e in events if e != "collected"]
    assert timed[:3] == ["import", "compile", "compile"] and "ort" in timed
    for label in ("import", "compile", "ort"):
        for i, e in enumerate(events):
            if e == label:
                assert events[i - 1] == "collected", events


def _fake_torch_compile(monkeypatch, events: list, medians) -> object:
    """The bench module, with torch.compile, Inductor's ``fresh_cache``, Dynamo's reset and the
    rounds replaced by fakes that log to ``events`` (the compiled module logs each call)."""
    import contextlib

    import torch
    import torch._inductor.utils as inductor_utils
    sys.path.insert(0, str(BENCH.parent))
    import run

    @contextlib.contextmanager
    def fresh_cache():
        events.append("enter")
        yield
        events.append("exit")

    def fake_compile(module, backend=None):
        events.append("compile")
        return lambda x: (events.append("call"), module(x))[1]
    monkeypatch.setattr(inductor_utils, "fresh_cache", fresh_cache)
    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: events.append("reset"))
    monkeypatch.setattr(run, "interleaved_medians", medians)
    return run


def test_each_models_torch_compile_first_call_starts_from_empty_caches(monkeypatch):
    """torch.compile's first call, which compiles, runs inside Inductor's ``fresh_cache`` (a new
    cache directory, in-memory caches cleared): in one shared cache softmax_by_hand's first call
    reused softmax's kernel. Its later, timed calls run outside."""
    from models import workloads

    events = []
    run = _fake_torch_compile(monkeypatch, events, lambda timers, *a, **k: (
        timers["compile"](), {n: (1.0, 1.0, 1.0) if n.startswith("ours") else 1.0 for n in timers})[1])
    row = run.bench_one("softmax", workloads(quick=True)["softmax"], 1, ["autofuse"], with_compile=True)
    assert events[:5] == ["reset", "compile", "enter", "call", "exit"], events
    assert set(events[5:]) == {"call"} and events[5:], events
    assert row["torch_compile_build_s"] > 0


def test_softmax_floor_times_a_softmax_by_hand_that_agrees_with_ours():
    # the tool checks its C++ softmax against our compiled one before timing (an assertion that
    # fails the run); for AVX2 code as well, which both CPU kinds we run on execute
    import shutil
    for extra in ([], ["--mcpu", "haswell"]):
        out = subprocess.run([sys.executable, str(BENCH.parent / "softmax_floor.py"), "--rows", "8", "--cols", "64",
                              "--repeat", "1", *extra], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr[-3000:]
        if shutil.which("c++") or shutil.which("g++"):
            timed = [line.split()[0:3] for line in out.stdout.splitlines()[1:]]
            assert len(timed) == 5 and "whole softmax" in out.stdout and "ours: kernel" in out.stdout
        else:
            assert "no C++ compiler" in out.stdout


def test_compile_times_are_the_median_of_compiles_from_scratch(monkeypatch):
    """``compile_samples`` compiles each, ours (import and build) and torch.compile's first
    call (Dynamo reset, caches empty, a new compiled module each time): one sample moved a
    0.08 s compile by 1.5x between two runs."""
    from models import workloads

    events = []
    run = _fake_torch_compile(monkeypatch, events, lambda timers, *a, **k: (
        {n: (1.0, 1.0, 1.0) if n.startswith("ours") else 1.0 for n in timers}))
    row = run.bench_one("softmax", workloads(quick=True)["softmax"], 1, ["autofuse"], with_compile=True,
                        with_ort=False, compile_samples=3)
    assert events[:15] == ["reset", "compile", "enter", "call", "exit"] * 3, events
    assert set(events[15:]) == {"call"}, events  # the timed calls, of the last compiled module
    assert len(row["torch_compile_samples"]) == 3
    assert row["torch_compile_build_s"] == sorted(row["torch_compile_samples"])[1]
    assert len(row["import_samples"]) == 3 and row["import_s"] == sorted(row["import_samples"])[1]
    assert len(row["build_samples"]["autofuse"]) == 3
    assert row["build_s"]["autofuse"] == sorted(row["build_samples"]["autofuse"])[1]


def test_compile_depth_reports_the_kernels_repeated_layers_share():
    """Three (Linear, GELU, LayerNorm) layers: three kernel calls of one distinct kernel."""
    script = BENCH.parent / "compile_depth.py"
    out = subprocess.run([sys.executable, str(script), "--models", "stack:3", "--samples", "1", "--no-torch-compile"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    (row,) = [line.split() for line in out.stdout.splitlines() if line.startswith("stack:3")]
    assert row[1:3] == ["3", "1"] and float(row[3]) > 0
