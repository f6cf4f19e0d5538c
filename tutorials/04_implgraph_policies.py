"""ImplGraph schedules: one fused kernel, every policy that fits it, side by side.

    python tutorials/04_implgraph_policies.py [--quick]

A matmul with its bias-and-ReLU epilogue is fused into one kernel. Each policy that fits it
builds a ScheduleResult: the ImplGraph of every block (``sched.axis`` with each axis's type,
size expression, ``from`` and ``split_pair``; ``sched.loop_axis``; the vectorized axes),
applied to TVM's ``s_tir.Schedule``. Then the same for a softmax, whose persistent-row form
keeps several ScheduleGroups under one shared row axis. Every result is checked and timed.
"""
import argparse
import os

os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_ext  # noqa: E402
from schedules import Machine, ScheduleBuilder, block_infos, schedule_kernel  # noqa: E402
from schedules.heuristic import default_knobs, policies_for  # noqa: E402
from schedules.policies import PersistentRows  # noqa: E402

R = relax.op


def fused_kernel(make, shapes):
    """The unscheduled PrimFunc tvm_ext builds for the graph ``make`` (one kernel)."""
    params = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make(*params))
        bb.emit_func_output(out)
    pipeline = tvm_ext.Pipeline(schedule=False)
    lowered, _ = pipeline.lower(pipeline.prepare(bb.get()))
    return next(f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc))


def time_ms(func, inputs, out_shape, repeat):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), tvm_ext.host_target())
    args = [tvm.runtime.tensor(a) for a in inputs] + [tvm.runtime.empty(out_shape, "float32")]
    lib["main"](*args)
    result = lib.mod.time_evaluator("main", tvm.cpu(), number=5, repeat=repeat)(*args)
    return float(np.median(result.results)) * 1e3, args[-1].numpy()


def compare(title, func, inputs, out_shape, block_index, repeat):
    print(f"==== {title}")
    machine = Machine.for_target(tvm_ext.host_target())
    info = block_infos(ScheduleBuilder(func).sch)[block_index]
    base_ms, want = time_ms(func, inputs, out_shape, repeat)
    print(f"unscheduled: {base_ms:.3f} ms\n")
    policies = [PersistentRows(machine)] if block_index < 0 else policies_for(info, machine)
    for policy in policies:
        builder = ScheduleBuilder(func)
        if not policy.applies(info, builder):
            continue
        knobs = default_knobs(policy, info, fuse_epilogue=True)  # the heuristic's knobs
        try:
            policy.apply(builder, info, knobs)
        except (ValueError, RuntimeError) as err:
            print(f"{policy.name} {knobs}: rejected ({type(err).__name__})\n")
            continue
        builder.choose(policy.name, knobs)
        result = builder.result(title)
        ms, got = time_ms(result.func, inputs, out_shape, repeat)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        print(result.describe())
        print(f"-> {ms:.3f} ms ({base_ms / ms:.1f}x the unscheduled kernel), matches it\n")
    chosen = schedule_kernel(func, machine, name=title)
    print(f"the heuristic's choice without tuning: {chosen.policy}\n")


def main(quick: bool) -> None:
    repeat = 3 if quick else 9
    m, k, n = (64, 64, 64) if quick else (512, 512, 512)
    rng = np.random.default_rng(0)
    func = fused_kernel(lambda a, w, b: R.nn.relu(R.add(R.matmul(a, w), b)), [(m, k), (k, n), (n,)])
    inputs = [rng.standard_normal(s).astype("float32") for s in [(m, k), (k, n), (n,)]]
    compare("matmul + bias + relu", func, inputs, (m, n), 0, repeat)

    rows, cols = (32, 256) if quick else (2048, 1024)
    func = fused_kernel(lambda x: R.nn.softmax(x, axis=-1), [(rows, cols)])
    compare("softmax", func, [rng.standard_normal((rows, cols)).astype("float32")], (rows, cols), -1, repeat)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    main(parser.parse_args().quick)
