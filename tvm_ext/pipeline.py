"""The pipeline: frontend -> graph passes -> schedules -> build -> runtime.

``compile(model, ...)`` is the one entry point users call; ``Pipeline`` holds its
configuration and exposes each stage (``import_``, ``lower``, ``build``) for those who want
to look at the module between them.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import tvm
from tvm import relax

from relay_passes.autofuse import AutoFuse
from relay_passes.pack_weights import PackMatmulWeights
from relay_passes.place_device import PlaceDevice
from relay_passes.plan_memory import PlanMemory
from relay_passes.conv_layout import BlockConvLayout
from relay_passes.conv_as_conv2d import ConvAsConv2d
from relay_passes.simplify import EliminateCommonSubexprAroundWeights, FoldTupleGetItem, FoldWeightLayout
from relay_passes.erf_gelu import ErfGelu
from relay_passes.sigmoid_gate import SigmoidGate
from relay_passes.tanh_softplus import TanhSoftplus
from relay_passes.fuse_compile import FuseCompile
from relay_passes.grouping import MakeGroups
from relay_passes.strategies import PARTITIONERS
from schedules import Machine, ScheduleKernels
from schedules.database import TuningDatabase
from schedules.history import ApplyHistoryBest, model_check, model_check_task
from tvm_ext.build_pipeline import build_executable, relax_pipeline
from tvm_ext.compiled_model import CompiledModel, dim_bounds_of, outputs_of, signature_of
from tvm_ext.cyclic_gc import cyclic_gc_paused
from tvm_ext.errors import CompileError, UnsupportedDtypeError, UnsupportedOpError
from tvm_ext.frontends import import_model
from tvm_ext.measured_rollback import MeasuredRollback
from tvm_ext.registry import OPS, OpRegistry
from tvm_ext.report import Decision, FusionReport, kernels_of
from tvm_ext.target import resolve_target

#: dtypes any path of this compiler can build on CPU (ours or TVM's kernels).
BUILDABLE_DTYPES = frozenset(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                              "uint64", "float16", "bfloat16", "float32", "float64"])

#: ops the Relax VM runs itself (no kernel needed after LegalizeOps).
_VM_OPS_PREFIXES = ("relax.call_", "relax.builtin.", "relax.memory.", "relax.vm.")
_VM_OPS = frozenset(["relax.null_value", "relax.shape_of", "relax.hint_on_device", "relax.to_vdevice",
                     "relax.make_closure", "relax.invoke_closure", "relax.invoke_pure_closure",
                     "relax.tensor_to_shape", "relax.shape_to_tensor", "relax.print", "relax.assert_op",
                     "relax.reshape"])  # reshape: left by RewriteDataflowReshape, a zero-copy view

FUSION_CHOICES = (*PARTITIONERS, "tvm")  # "tvm": TVM's FuseOps + FuseTIR, our schedules
ROLLBACK_CHOICES = ("count", "measure")  # the seed's count rule; AutoFuse's kernels timed against their parts


@dataclass
class Pipeline:
    """Configuration of one compilation; ``run`` does all stages."""

    target: Any = None
    fusion: Any = "autofuse"  # a FUSION_CHOICES name or a partitioner (relay_passes.AutoFuse(...))
    passes: Sequence[tvm.ir.transform.Pass] = ()  # user passes run after import, before fusion
    schedule: bool = True  # give our kernels their default schedule
    strict: bool = False  # a failing lowering raises instead of falling back to TVM's kernel
    registry: OpRegistry = OPS  # the ops our lowering knows
    exact_math: bool = False  # libm exp/sigmoid instead of the vectorizable float32 forms
    pack_weights: bool = True  # constant matmul operands stored in column panels (autofuse)
    block_conv: bool = True  # convolutions in NCHW16c, activations kept blocked between them
    tuning_db: Any = None  # a tuning database (path or TuningDatabase): its best schedules win
    group2ctx: dict | None = None  # device group -> device ("cpu:1", ...): PlaceDevice runs
    device_labels: dict | None = None  # node or input name -> device group, besides ctx_group attributes
    rollback: str = "count"  # "count": the seed's rule; "measure": time each kernel against its parts
    progress: Any = None  # a callable taking one line of text: long work (measured rollback) reports to it
    follow_model_check: bool = True  # leave the tuning database out for a model whose latest check by
    #   tune timed it slower with the database than without (False: use it regardless, as the check's build)
    timings: dict[str, float] = field(default_factory=dict)
    scheduler: ScheduleKernels | None = field(default=None, init=False)  # the last schedule pass run
    placement: PlaceDevice | None = field(default=None, init=False)  # the last PlaceDevice run
    model_task: str | None = field(default=None, init=False)  # the model's check task in a tuning database
    records_note: str | None = field(default=None, init=False)  # why the database was not used

    def __post_init__(self):
        if not callable(self.fusion) and self.fusion not in FUSION_CHOICES:
            raise ValueError(f"unknown fusion {self.fusion!r}; choose one of {FUSION_CHOICES}")
        self.target = resolve_target(self.target)
        if self.rollback not in ROLLBACK_CHOICES:
            raise ValueError(f"unknown rollback {self.rollback!r}; choose one of {ROLLBACK_CHOICES}")
        if self.rollback == "measure" and self.fusion != "autofuse":
            raise ValueError(f"rollback='measure' is AutoFuse's: it needs fusion='autofuse', not {self.fusion!r}")
        if isinstance(self.tuning_db, (str, os.PathLike)):
            self.tuning_db = TuningDatabase(self.tuning_db)

    def _partitioner(self) -> Any:
        """The fusion strategy; AutoFuse with a rollback judge when measuring or when a
        tuning database may hold measured rollback decisions."""
        db = self._database()
        if self.fusion != "autofuse" or (self.rollback == "count" and db is None):
            return self.fusion
        return AutoFuse(judge=MeasuredRollback(self.target, self._build_alone, db,
                                               measure=self.rollback == "measure", progress=self.progress))

    def _build_alone(self, mod: tvm.IRModule, fusion: Any) -> CompiledModel:
        """A part of the model (one group) compiled as this pipeline would, for the rollback judge;
        its weights are already packed and its convolutions blocked."""
        return Pipeline(target=self.target, fusion=fusion, registry=self.registry, exact_math=self.exact_math,
                        pack_weights=False, block_conv=False).run(mod)

    def prepare(self, mod: tvm.IRModule) -> tvm.IRModule:
        """Normalize the imported module: dataflow blocks, folded constants, canonical bindings."""
        check_dtypes(mod)
        # our conv2d lowering takes conv1d and conv2d_transpose too; then the blocked layout
        convs = [] if self.fusion == "tvm" else [ConvAsConv2d()] + (
            [BlockConvLayout(registry=self.registry)] if self.block_conv else [])
        algebra = [] if self.exact_math else [TanhSoftplus(), SigmoidGate(), ErfGelu()]  # exact math: the model's ops
        seq = [relax.transform.ConvertToDataflow(), *self.passes, *convs, FoldWeightLayout(self.registry), FoldTupleGetItem(),
               *algebra, relax.transform.CanonicalizeBindings(), EliminateCommonSubexprAroundWeights(),
               relax.transform.DeadCodeElimination()]
        with self.target:
            mod = tvm.transform.Sequential(seq)(mod)
        if self.group2ctx is not None or self.device_labels:
            if self.fusion == "tvm":
                raise CompileError("device placement (group2ctx) needs one of our fusion strategies; "
                                   f"fusion='tvm' builds for one target. Choose one of {PARTITIONERS}")
            self.placement = PlaceDevice(self.group2ctx or {}, self.device_labels, self.target,
                                         registry=self.registry)
            with self.target:
                mod = self.placement(mod)
        return mod

    def lower(self, mod: tvm.IRModule) -> tuple[tvm.IRModule, FusionReport]:
        """Fuse and lower: groups -> our kernels, the rest -> TVM's legalization; schedule ours."""
        if self.fusion == "tvm":
            return self._lower_with_tvm_fusion(mod)
        groups = MakeGroups(self._partitioner(), registry=self.registry)
        fuse = FuseCompile(registry=self.registry, strict=self.strict, exact_math=self.exact_math)
        seq = [groups, fuse, relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
               relax.transform.RewriteDataflowReshape()]
        if self.pack_weights and self.fusion == "autofuse":  # AutoFuse composes the panel views
            # into the matmul's loads (NNVM's rules would copy the weight back every call); a
            # panel is the register tile's j extent, two float32 vectors
            seq.insert(0, PackMatmulWeights(panel=2 * Machine.for_target(self.target).vector_bytes // 4))
        if self.schedule:  # TVM's kernels of the ops we do not lower too: unscheduled, they ran one
            # scalar loop nest on one core (bilinear resize of 4x64x28x28: 1.7 ms, 0.75-0.88 scheduled; eager 0.71-0.84)
            seq.append(self._schedule_pass())
        with self.target:
            lowered = tvm.transform.Sequential(seq)(mod)
        report = _report(lowered, groups, fuse, self.placement)
        if self.records_note is not None:
            report.decisions.append(Decision("model", "", "tuning", self.records_note))
        return lowered, report

    def _lower_with_tvm_fusion(self, mod: tvm.IRModule) -> tuple[tvm.IRModule, FusionReport]:
        """TVM's own fusion (FuseOps + FuseTIR) with our default schedules on its kernels."""
        seq = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
               relax.transform.FuseTIR(), relax.transform.RewriteDataflowReshape()]
        if self.schedule:
            seq.append(self._schedule_pass())
        with self.target:
            lowered = tvm.transform.Sequential(seq)(mod)
        kernels, views = kernels_of(lowered)
        return lowered, FusionReport(kernels, views)

    def _database(self) -> TuningDatabase | None:
        """The tuning database this compile uses: none when the latest check of this model by
        ``tune`` timed it slower built with the database than without (``follow_model_check``)."""
        if self.tuning_db is None:
            return None
        if self.follow_model_check and self.model_task is not None:
            check = model_check(self.tuning_db, self.model_task, self.target, Machine.for_target(self.target))
            if check is not None and check[0] > check[1]:
                self.records_note = (f"tuning database not used: tune's check timed this model at {check[0]:.3f} ms "
                                     f"with it and {check[1]:.3f} ms without, as called")
                return None
        return self.tuning_db

    def _schedule_pass(self) -> ScheduleKernels:
        """The heuristic's (or the tuning database's) schedules for our kernels and TVM's alike."""
        db = self._database()
        history = ApplyHistoryBest(db, self.target) if db is not None else None
        self.scheduler = ScheduleKernels(Machine.for_target(self.target), all_kernels=True, history=history)
        return self.scheduler

    def build(self, lowered: tvm.IRModule, source: tvm.IRModule, report: FusionReport) -> CompiledModel:
        """PlanMemory and the rest of TVM's VM lowering, then code generation."""
        plan = PlanMemory(self.registry)
        try:
            with self.target:
                vm_module = relax_pipeline(plan)(lowered)
            executable = build_executable(vm_module, self.target)
        except Exception as err:
            unknown = unlowered_ops(lowered)  # ops TVM's later passes (sort, scan) did not take either
            if unknown:
                where, op = unknown[0]
                raise UnsupportedOpError(
                    f"node '{where}' uses {op}, which has no lowering in tvm_ext and which TVM could not "
                    f"build either ({_last_line(err)}). Register a Loop-IR lowering with "
                    f"tvm_ext.register_op('{op}', pattern, lower=...) or rewrite the model without this op."
                ) from err
            raise CompileError(f"TVM failed to build the lowered module: {_last_line(err)}") from err
        report.memory = plan.reports.get("main")
        devices = [d.name for d in self.placement.devices] if self.placement is not None else []
        return CompiledModel(executable, signature_of(source), report, str(self.target), entry=plan.entry,
                             outputs=outputs_of(source), dim_bounds=dim_bounds_of(source), devices=devices)

    def run(self, model: Any, example_inputs: Sequence[Any] | None = None,
            shape_dict: dict | None = None) -> CompiledModel:
        with cyclic_gc_paused():  # the whole compile: see tvm_ext/cyclic_gc.py
            t0 = time.perf_counter()
            mod = import_model(model, example_inputs, shape_dict)
            if self.tuning_db is not None:  # the hash reads every weight: only where a check may apply
                self.model_task = model_check_task(mod, self.fusion if isinstance(self.fusion, str)
                                                   else type(self.fusion).__name__)
            t1 = time.perf_counter()
            prepared = self.prepare(mod)
            lowered, report = self.lower(prepared)
            t2 = time.perf_counter()
            compiled = self.build(lowered, prepared, report)
            t3 = time.perf_counter()
        self.timings = {"import": t1 - t0, "passes": t2 - t1, "build": t3 - t2}
        compiled.lowered_module = lowered
        return compiled


def compile(model: Any, example_inputs: Sequence[Any] | None = None, *, target: Any = None,
            fusion: Any = "autofuse", passes: Sequence[tvm.ir.transform.Pass] = (),
            shape_dict: dict[str, Sequence[int]] | None = None, strict: bool = False,
            registry: OpRegistry = OPS, exact_math: bool = False, tuning_db: Any = None,
            block_conv: bool = True, group2ctx: dict[str, Any] | None = None,
            device_labels: dict[str, str] | None = None, rollback: str = "count",
            progress: Any = None) -> CompiledModel:
    """Compile a model to fused, scheduled kernels on the Relax VM.

    ``model`` is a Relax ``tvm.IRModule``, a ``torch.nn.Module`` (with ``example_inputs``), a
    ``torch.export.ExportedProgram``, a ``tvm_ext.sym`` Symbol, an ONNX ``ModelProto`` or a
    path to a ``.onnx`` file (with ``shape_dict`` for dynamic inputs). ``target`` defaults to
    this CPU with all its cores; ``fusion`` is ``"nnvm"`` (NNVM's fusion: anchors with their
    epilogues, injective chains, diamonds), ``"chains"`` (maximal elementwise/broadcast
    trees), ``"none"`` (one kernel per op), ``"each"`` (one kernel per op, views included) or a
    partitioner (``relay_passes.FusePartition(...)``).
    ``exact_math=True`` keeps libm's exp and sigmoid (scalar calls) instead of the
    vectorizable float32 forms of ``tvm_ext.fast_math``. ``tuning_db`` (a path or a
    ``schedules.TuningDatabase``, filled by ``tvm_ext.tune``) gives every kernel it has records
    for its best measured schedule; the others keep the heuristic's. ``block_conv=False`` keeps
    convolutions in NCHW instead of the channel-blocked NCHW16c (``relay_passes.BlockConvLayout``).
    ``group2ctx`` (``{"dev1": "cpu:0", "dev2": "cpu:1"}``, a device optionally with its own
    target: ``{"device": "cpu:1", "target": "x86-64"}``) places the nodes labelled with each
    group (``sym.AttrScope(ctx_group=...)``, or ``device_labels={node or input name: group}``
    for any model) on its device, with copies between devices (``relay_passes.PlaceDevice``).
    ``rollback="measure"`` (AutoFuse) times each kernel of two or more ops against its ops
    built apart and splits it where they are faster (``tvm_ext.measured_rollback``); the
    default, ``"count"``, is the seed's rule. ``progress`` (e.g. ``print``) is told each measurement.
    """
    pipeline = Pipeline(target=target, fusion=fusion, passes=passes, strict=strict, registry=registry,
                        exact_math=exact_math, tuning_db=tuning_db, block_conv=block_conv, group2ctx=group2ctx,
                        device_labels=device_labels, rollback=rollback, progress=progress)
    return pipeline.run(model, example_inputs, shape_dict)


# --------------------------------------------------------------------------- checks
def check_dtypes(mod: tvm.IRModule) -> None:
    """Every tensor of every Relax function has a dtype some kernel path can build."""
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for p in func.params:
            _check_dtype(p.ty, f"input '{p.name}' of {gv.name_hint}")
        for block in func.body.blocks:
            for b in block.bindings:
                op = b.value.op.name if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op) else ""
                _check_dtype(b.var.ty, f"node '{b.var.name}'" + (f" ({op})" if op else ""))


def _check_dtype(ty, where: str) -> None:
    if isinstance(ty, relax.TupleType):
        for f in ty.fields:
            _check_dtype(f, where)
        return
    if isinstance(ty, relax.TensorType) and str(ty.dtype) not in BUILDABLE_DTYPES | {"void"}:
        raise UnsupportedDtypeError(
            f"{where} has dtype {ty.dtype}, which this compiler cannot build for CPU "
            f"(supported: {', '.join(sorted(BUILDABLE_DTYPES))}); cast it with astype first")


def unlowered_ops(mod: tvm.IRModule) -> list[tuple[str, str]]:
    """(node, op) of every op call LegalizeOps left that the VM does not run itself."""
    found = []
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for b in block.bindings:
                v = b.value
                if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)):
                    continue
                name = v.op.name
                if not (name.startswith(_VM_OPS_PREFIXES) or name in _VM_OPS or v.op.get_attr("FCallPacked")):
                    found.append((b.var.name, name))
    return found


def _report(lowered: tvm.IRModule, groups: MakeGroups, fuse: FuseCompile,
            placement: PlaceDevice | None = None) -> FusionReport:
    kernels, views = kernels_of(lowered)
    decisions = [Decision(p.node, "", "place", f"{p.device}: {p.reason}") for p in placement.decisions] \
        if placement is not None else []
    for part in groups.partitions:
        for d in part.decisions:
            node = part.graph[d.node]
            decisions.append(Decision(node.name, (node.op or node.kind).replace("relax.", ""), d.action, d.reason))
    decisions += [Decision(node, op, "stage", why) for node, op, why in fuse.log.stages]
    decisions += [Decision(group, "", "share", f"calls {kernel}: their kernels differ only in names")
                  for group, kernel in fuse.log.shared.items()]
    copies = [asdict(c) for c in placement.copies] if placement is not None else []
    return FusionReport(kernels, views, decisions, dict(fuse.log.fallbacks), copies=copies)


def _last_line(err: Exception) -> str:
    lines = [l for l in str(err).strip().splitlines() if l.strip()]
    return lines[-1] if lines else type(err).__name__
