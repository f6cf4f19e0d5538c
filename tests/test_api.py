"""The compiled model's API (call, benchmark, report, export/load) and the command line."""
from __future__ import annotations

import io
import subprocess
import sys
import warnings

import numpy as np
import onnx
import pytest
import torch
from tvm import relax

import tvm_ext
from conftest import build_module

R = relax.op


@pytest.fixture(scope="module")
def softmax_model():
    mod = build_module(lambda x, b: R.nn.softmax(R.add(x, b), axis=-1),
                       [((64, 256), "float32"), ((256,), "float32")], names=["x", "b"])
    return tvm_ext.compile(mod)


def test_call_accepts_numpy_and_torch(softmax_model):
    x = np.random.default_rng(0).standard_normal((64, 256)).astype("float32")
    b = np.zeros(256, "float32")
    e = np.exp(x - x.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(softmax_model(x, b), want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(softmax_model(torch.from_numpy(x), torch.from_numpy(b)), want, rtol=1e-5, atol=1e-7)


def test_benchmark_reports_a_median(softmax_model):
    result = softmax_model.benchmark(number=3, repeat=5)
    assert result.runs == 5
    assert 0 < result.min_ms <= result.median_ms
    assert "median" in str(result)


def test_report_lists_kernels_with_bytes(softmax_model):
    report = softmax_model.report()
    (kernel,) = report.kernels  # the add fuses into the softmax: its input is read once
    assert kernel.ops == ["add", "nn.softmax"] and kernel.pattern == "OutEWiseFusable"
    assert kernel.bytes_read == (64 * 256 + 256) * 4 and kernel.bytes_written == 64 * 256 * 4
    text = str(report)
    assert "1 kernels" in text and "nn.softmax" in text
    assert "local" in kernel.loop_ir and kernel.schedule


def test_export_and_load_round_trip(softmax_model, tmp_path):
    path = tmp_path / "model.so"
    softmax_model.export(path)
    loaded = tvm_ext.CompiledModel.load(path)
    assert loaded.inputs == softmax_model.inputs
    assert loaded.report().to_dict() == softmax_model.report().to_dict()
    x = np.random.default_rng(1).standard_normal((64, 256)).astype("float32")
    b = np.random.default_rng(2).standard_normal(256).astype("float32")
    np.testing.assert_array_equal(loaded(x, b), softmax_model(x, b))
    with pytest.raises(tvm_ext.InputError):
        loaded(x)


def test_pipeline_stages_can_be_run_one_by_one():
    mod = build_module(lambda x: R.nn.relu(R.exp(x)), [((8, 8), "float32")])
    pipe = tvm_ext.Pipeline(fusion="chains")
    prepared = pipe.prepare(mod)
    lowered, report = pipe.lower(prepared)
    assert "fused_exp_relu" in [gv.name_hint for gv in lowered.get_global_vars()]
    compiled = pipe.build(lowered, prepared, report)
    x = np.random.default_rng(0).standard_normal((8, 8)).astype("float32")
    np.testing.assert_allclose(compiled(x), np.maximum(np.exp(x), 0), rtol=1e-6)


def _run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "tvm_ext", *args], capture_output=True, text=True, timeout=timeout)


def test_cli_demo_checks_and_reports_speedup():
    out = _run_cli("demo", "--model", "elementwise_chain", "--repeat", "3")
    assert out.returncode == 0, out.stderr
    assert "-> OK" in out.stdout
    assert "speed-up over TVM's default build" in out.stdout
    assert "fused_" in out.stdout


def test_cli_compile_onnx_with_report(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 16),), f, input_names=["x"], opset_version=17, dynamo=False)
    path = tmp_path / "mlp.onnx"
    path.write_bytes(f.getvalue())
    lib = tmp_path / "mlp.so"
    out = _run_cli("compile", str(path), "--report", "--decisions", "-o", str(lib))
    assert out.returncode == 0, out.stderr
    assert "kernels" in out.stdout and "x: [2, 16] float32" in out.stdout
    assert lib.exists() and (tmp_path / "mlp.so.json").exists()
    x = np.random.default_rng(0).standard_normal((2, 16)).astype("float32")
    with torch.no_grad():
        np.testing.assert_allclose(tvm_ext.CompiledModel.load(lib)(x), model(torch.from_numpy(x)).numpy(),
                                   rtol=1e-4, atol=1e-5)


def test_cli_reports_errors_without_a_traceback(tmp_path):
    bad = tmp_path / "missing.onnx"
    out = _run_cli("compile", str(bad))
    assert out.returncode == 2
    assert out.stderr.startswith("error: cannot read ONNX model") and "Traceback" not in out.stderr
    assert onnx is not None


@pytest.mark.parametrize("damage, match", [
    ("truncate_library", "changed since export"),
    ("flip_library_bit", "changed since export"),
    ("edit_shapes", "changed since export"),
    ("truncate_json", "not valid JSON"),
    ("remove_library", "is missing"),
    ("remove_json", "is missing"),
])
def test_a_damaged_export_is_refused_before_loading(softmax_model, tmp_path, damage, match):
    import json
    import pathlib

    path = tmp_path / "m.so"
    softmax_model.export(path)
    lib, meta = pathlib.Path(path), pathlib.Path(str(path) + ".json")
    if damage == "truncate_library":
        lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])
    elif damage == "flip_library_bit":
        data = bytearray(lib.read_bytes())
        data[len(data) // 2] ^= 1
        lib.write_bytes(bytes(data))
    elif damage == "edit_shapes":
        edited = json.loads(meta.read_text())
        edited["inputs"][0]["shape"] = [128, 256]
        meta.write_text(json.dumps(edited))
    elif damage == "truncate_json":
        meta.write_text(meta.read_text()[:40])
    elif damage == "remove_library":
        lib.unlink()
    else:
        meta.unlink()
    with pytest.raises(tvm_ext.ModelFileError, match=match) as info:
        tvm_ext.CompiledModel.load(path)
    assert "m.so" in str(info.value) and "export the model again" in str(info.value).lower()


def test_cli_demo_computes_its_numpy_reference_before_it_compiles_and_times(monkeypatch, capsys):
    """numpy's BLAS threads spin a while after the reference's matmuls: a call timed right after
    them ran at half speed on 2 cores. The demo computes the reference first."""
    import dataclasses

    from tvm_ext import cli
    from tvm_ext import models as builtin

    events = []
    make = builtin.BUILTIN_MODELS["elementwise_chain"]

    def recorded():
        model = make()
        return dataclasses.replace(model, reference=lambda *a: (events.append("reference"), model.reference(*a))[1])
    monkeypatch.setitem(builtin.BUILTIN_MODELS, "elementwise_chain", recorded)
    compile_ = tvm_ext.compile
    monkeypatch.setattr(tvm_ext, "compile", lambda *a, **k: (events.append("compile"), compile_(*a, **k))[1])
    time_call = tvm_ext.CompiledModel.time_call
    monkeypatch.setattr(tvm_ext.CompiledModel, "time_call",
                        lambda self, *a, **k: (events.append("time_call"), time_call(self, *a, **k))[1])
    assert cli.main(["demo", "--model", "elementwise_chain", "--repeat", "1"]) == 0
    assert "-> OK" in capsys.readouterr().out
    assert events[:3] == ["reference", "compile", "time_call"] and events.count("reference") == 1
