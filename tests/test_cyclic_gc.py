"""The cycle collector is paused for a whole compile (tvm_ext/cyclic_gc.py) and resumed as it was."""
import gc

import numpy as np
import pytest

import tvm_ext
from tvm_ext import pipeline as pipeline_module
from tvm_ext.cyclic_gc import cyclic_gc_paused
from tvm_ext.errors import ShapeError


@pytest.fixture
def collector_restored():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_the_passes_and_the_build_run_with_the_collector_paused_and_it_resumes_after(monkeypatch, collector_restored):
    seen = {}
    prepare, build = pipeline_module.Pipeline.prepare, pipeline_module.Pipeline.build

    def spy(name, method):
        def wrapped(self, *args, **kwargs):
            seen[name] = gc.isenabled()
            return method(self, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(pipeline_module.Pipeline, "prepare", spy("passes", prepare))
    monkeypatch.setattr(pipeline_module.Pipeline, "build", spy("build", build))
    x = tvm_ext.sym.Variable("x", shape=(4, 8))
    gc.enable()
    compiled = tvm_ext.compile(tvm_ext.sym.relu(x) + 1.0)
    assert seen == {"passes": False, "build": False}
    assert gc.isenabled()
    a = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    np.testing.assert_allclose(compiled(a), np.maximum(a, 0) + 1, rtol=1e-6)


def test_a_failed_compile_resumes_the_collector(collector_restored):
    gc.enable()
    x = tvm_ext.sym.Variable("x", shape=(4, 8))
    with pytest.raises(ShapeError):
        tvm_ext.compile(tvm_ext.sym.dot(x, x))  # (4, 8) x (4, 8): the inner dimensions differ
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off(collector_restored):
    gc.disable()
    x = tvm_ext.sym.Variable("x", shape=(4, 8))
    tvm_ext.compile(tvm_ext.sym.relu(x))
    assert not gc.isenabled()


def test_overlapping_pauses_of_the_cycle_collector_resume_it_once_the_last_ends(collector_restored):
    gc.enable()
    outer = cyclic_gc_paused()
    inner = cyclic_gc_paused()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # another thread's import ends first
    assert not gc.isenabled()
    inner.__exit__(None, None, None)
    assert gc.isenabled()
    with pytest.raises(ValueError), cyclic_gc_paused():
        raise ValueError("a failed export")
    assert gc.isenabled()
