"""build_executable: the kernels' code generated on several threads, linked as one library and
its imports, runs, exports and loads like tvm.compile's single library."""
import threading

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_ext
from conftest import build_module
from relay_passes.plan_memory import PlanMemory
from tvm_ext.build_pipeline import build_executable, relax_pipeline
from tvm_ext.compiled_model import CompiledModel, outputs_of, signature_of
from tvm_ext.pipeline import Pipeline

R = relax.op


def _two_kernels():
    """matmul, relu and softmax in one kernel, a second matmul in another (AutoFuse)."""
    rng = np.random.default_rng(0)
    w1, w2 = (relax.const(rng.standard_normal(s).astype("float32")) for s in ((16, 32), (32, 4)))

    def make(x):
        bb = relax.BlockBuilder.current()
        return R.matmul(bb.emit(R.nn.softmax(bb.emit(R.nn.relu(R.matmul(x, w1))), axis=-1)), w2)
    return build_module(make, [((8, 16), "float32")]), w1.value.numpy(), w2.value.numpy()


def _numpy(x, w1, w2):
    h = np.maximum(x @ w1, 0)
    e = np.exp(h - h.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ w2


@tvm.instrument.pass_instrument
class _PassNames:
    def __init__(self):
        self.names = []

    def run_before_pass(self, mod, info):
        self.names.append(info.name)


def _build(mod, jobs):
    pipeline = Pipeline()
    prepared = pipeline.prepare(mod)
    lowered, report = pipeline.lower(prepared)
    plan = PlanMemory(pipeline.registry)
    with pipeline.target:
        vm_module = relax_pipeline(plan)(lowered)
    record = _PassNames()
    with tvm.transform.PassContext(opt_level=3, instruments=[record]):
        executable = build_executable(vm_module, pipeline.target, jobs=jobs)
    model = CompiledModel(executable, signature_of(prepared), report, str(pipeline.target), entry=plan.entry,
                          outputs=outputs_of(prepared))
    return model, sorted(record.names)


def test_kernels_built_on_two_threads_match_one_build_and_numpy(tmp_path):
    mod, w1, w2 = _two_kernels()
    x = np.random.default_rng(1).standard_normal((8, 16)).astype("float32")
    one, one_passes = _build(mod, jobs=1)
    two, two_passes = _build(mod, jobs=2)
    assert len(one.report().kernels) == 2
    np.testing.assert_allclose(two(x), _numpy(x, w1, w2), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(two(x), one(x))
    # each thread ran the TIR pipeline on its kernels' modules under the caller's PassContext:
    # its instruments saw every pass of the one build, once a kernel
    assert sorted(two_passes) == sorted(one_passes) and one_passes.count("AcceptUnalignedArguments") == 2
    assert "AcceptUnalignedArguments" in one_passes and "RejoinMergedIndices" in one_passes
    two.export(tmp_path / "model.so")
    loaded = CompiledModel.load(tmp_path / "model.so")
    np.testing.assert_array_equal(loaded(x), one(x))


def test_the_pipeline_builds_a_model_of_several_kernels_on_every_core():
    mod, w1, w2 = _two_kernels()
    x = np.random.default_rng(2).standard_normal((8, 16)).astype("float32")
    np.testing.assert_allclose(tvm_ext.compile(mod)(x), _numpy(x, w1, w2), rtol=1e-5, atol=1e-6)


def test_each_kernels_machine_code_is_generated_while_building_on_a_worker_thread(monkeypatch):
    """LLVM makes a module's machine code at the first lookup of one of its functions; the build
    looks each kernel up on the thread that built it, so the user's first call does not pay it."""
    mod, _, _ = _two_kernels()
    looked_up = []
    original = tvm.runtime.Module.get_function

    def record(self, name, *args, **kwargs):
        looked_up.append((name, threading.current_thread() is threading.main_thread()))
        return original(self, name, *args, **kwargs)
    monkeypatch.setattr(tvm.runtime.Module, "get_function", record)
    model, _ = _build(mod, jobs=2)
    kernels = {k.name for k in model.report().kernels}
    assert len(kernels) == 2
    assert {name for name, _ in looked_up} >= kernels
    assert all(not on_main for name, on_main in looked_up if name in kernels)


def _llvm_modules(module):
    for lib in module.imports:
        if lib.kind == "llvm":
            yield lib
        yield from _llvm_modules(lib)


def test_our_kernels_are_built_without_argument_checks_and_the_model_still_checks_its_inputs():
    # the VM hands a kernel its own tensors and the inputs CompiledModel has checked: the kernel's
    # entry does not check them again (no error to raise in its code)
    mod, w1, w2 = _two_kernels()
    model, _ = _build(mod, jobs=2)
    libs = list(_llvm_modules(model.executable.mod))
    assert len(libs) == 2
    for lib in libs:
        assert "TVMFFIErrorSetRaised" not in lib.inspect_source("ll")
    x = np.random.default_rng(3).standard_normal((8, 16)).astype("float32")
    np.testing.assert_allclose(model(x), _numpy(x, w1, w2), rtol=1e-5, atol=1e-6)
    with pytest.raises(tvm_ext.InputError, match="shape"):
        model(np.zeros((8, 15), "float32"))
    with pytest.raises(tvm_ext.InputError):
        model(np.zeros((16, 8), "float32").T)
