"""build_executable: the kernels' code generated on several threads, linked as one library and
its imports, runs, exports and loads like tvm.compile's single library."""
import threading

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_ext
from conftest import PassNames, build_module
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


def _build(mod, jobs):
    pipeline = Pipeline()
    prepared = pipeline.prepare(mod)
    lowered, report = pipeline.lower(prepared)
    plan = PlanMemory(pipeline.registry)
    with pipeline.target:
        vm_module = relax_pipeline(plan)(lowered)
    record = PassNames()
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
    # each thread ran the TIR pipeline on its share of the kernels, one module, under the caller's
    # PassContext: its instruments saw every pass of the one build, once a module (one thread:
    # both kernels in one module; two threads: a module each)
    assert set(two_passes) == set(one_passes)
    assert one_passes.count("AcceptUnalignedArguments") == 1 and two_passes.count("AcceptUnalignedArguments") == 2
    assert "RejoinMergedIndices" in one_passes
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
    assert len(libs) == 2  # a module a thread
    single, _ = _build(mod, jobs=1)
    assert len(list(_llvm_modules(single.executable.mod))) in (0, 1)  # both kernels in one module
    for lib in libs:
        assert "TVMFFIErrorSetRaised" not in lib.inspect_source("ll")
    x = np.random.default_rng(3).standard_normal((8, 16)).astype("float32")
    np.testing.assert_allclose(model(x), _numpy(x, w1, w2), rtol=1e-5, atol=1e-6)
    with pytest.raises(tvm_ext.InputError, match="shape"):
        model(np.zeros((8, 15), "float32"))
    with pytest.raises(tvm_ext.InputError):
        model(np.zeros((16, 8), "float32").T)


def _kernel(n: int, unroll: int, parallel: bool) -> tvm.tirx.PrimFunc:
    """y = x * 2 + 1 over n, split by ``unroll`` with the inner loop unrolled (and the outer one
    parallel): one store of 5 expression nodes (x[i], 2, the product, 1, the sum)."""
    from tvm import s_tir, te
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: x[i] * 2.0 + 1.0, name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]))
    outer, inner = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, unroll])
    sch.unroll(inner)
    if parallel:
        sch.parallel(outer)
    return sch.mod["main"]


def test_code_size_counts_each_store_once_an_unrolled_iteration_and_each_parallel_loop():
    from tvm_ext.build_pipeline import _KERNEL_BASE, code_size

    # a store is 2 + its 5 expression nodes = 7; each loop 1, a parallel one 20
    assert code_size(_kernel(64, 1, False)) == _KERNEL_BASE + 1 + 1 + 7
    assert code_size(_kernel(64, 8, False)) == _KERNEL_BASE + 1 + 1 + 8 * 7
    assert code_size(_kernel(64, 8, True)) == _KERNEL_BASE + 20 + 1 + 8 * 7


def test_kernel_groups_share_the_kernels_out_by_size_largest_first():
    from tvm_ext.build_pipeline import _KERNEL_BASE, code_size, kernel_groups

    big, mid, small, tiny = (_kernel(64, u, True) for u in (16, 8, 4, 1))
    assert [code_size(f) - _KERNEL_BASE for f in (big, mid, small, tiny)] == [21 + 16 * 7, 21 + 8 * 7, 21 + 4 * 7, 28]
    assert _KERNEL_BASE == 40
    kernels = [(relax.GlobalVar(n), f) for n, f in zip("tbsm", (tiny, big, small, mid))]
    # by hand, with a base of 40 (173, 117, 89, 68): big to the first group, mid to the empty
    # second, small to the second (117 < 173: 206), tiny to the first (173 < 206)
    groups = [[gv.name_hint for gv, _ in g] for g in kernel_groups(kernels, 2)]
    assert groups == [["b", "t"], ["m", "s"]]
    assert [[gv.name_hint for gv, _ in g] for g in kernel_groups(kernels, 1)] == [["b", "m", "s", "t"]]
    assert len(kernel_groups(kernels, 8)) == 4 and kernel_groups([], 2) == []


def test_the_vm_bytecode_is_generated_while_a_worker_thread_builds_the_only_kernel(monkeypatch):
    """The VM's code generation hashes every constant (17 ms for a 16 MiB weight): it runs on
    the calling thread while the workers build the kernels, even for a model of one kernel."""
    from tvm.relax import vm_build
    rng = np.random.default_rng(4)
    w = relax.const(rng.standard_normal((16, 8)).astype("float32"))
    mod = build_module(lambda x: R.matmul(x, w), [((4, 16), "float32")])
    building = threading.Event()
    seen = []
    build, codegen = tvm.tirx.build, vm_build._vmcodegen

    def build_on_worker(*args, **kwargs):
        building.set()
        return build(*args, **kwargs)

    def codegen_after_a_build_began(*args, **kwargs):
        # the old order (bytecode first, then the kernels) would leave this waiting in vain
        seen.append((building.wait(timeout=10), threading.current_thread() is threading.main_thread()))
        return codegen(*args, **kwargs)
    monkeypatch.setattr(tvm.tirx, "build", build_on_worker)
    monkeypatch.setattr(vm_build, "_vmcodegen", codegen_after_a_build_began)
    model, _ = _build(mod, jobs=2)
    assert len(model.report().kernels) == 1
    assert seen == [(True, True)]
    x = rng.standard_normal((4, 16)).astype("float32")
    np.testing.assert_allclose(model(x), x @ w.value.numpy(), rtol=1e-5, atol=1e-5)
