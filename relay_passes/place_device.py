"""PlaceDevice: NNVM's device planning (nnvm seed, "Device Planning") as a Relax pass.

Every node gets a device, then a copy is inserted wherever a value crosses devices:

- a forward topological pass: an input is on the default device, ``cpu:0``, where the
  caller's data is (a labelled input is copied to its group's device where it is read
  there); a labelled node takes its group's device; a node without a label takes the device of its first placed input; a node made
  by ``Gradient`` is left open, as is one whose inputs are all open (constants only);
- a reverse topological pass places what is left open: a backward node where the forward
  node it differentiates runs (``tvm_ext.grad_of``, written by ``Gradient``), another node
  on the device of its first placed reader;
- what is still open goes to the default device, and so do the function's results (copied
  back, as the caller reads them there).

Labels are the ``ctx_group`` attributes of the Symbol API (the function attribute
``tvm_ext.ctx_group``) or a ``{node or input name: group}`` map given to ``compile``, and
``group2ctx`` maps each group to a device (``"cpu:0"``, ``"cpu:1"``, each optionally with its
own target). Each (value, device) pair gets one copy (``R.to_vdevice``), shared by every
reader on that device. The pass builds a new function and leaves the given one unchanged
(add only, never modify, as the seed says). An op that mutates an input (``OpDef.mutates``)
cannot do so across devices: that is rejected, naming both nodes. Every decision is logged
(``decisions``), and every copy with its bytes (``copies``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax
from tvm.relax import VDevice

from tvm_ext import attrs
from tvm_ext.errors import CompileError, InputError, PlacementError
from tvm_ext.registry import OPS, OpRegistry
from tvm_ext.report import tensor_type_bytes
from tvm_ext.target import cpu_target, resolve_target

#: Device kinds: the DLPack device kind TVM's runtime calls them by, and the target kind.
_KINDS = {"cpu": ("cpu", "llvm"), "cuda": ("cuda", "cuda"), "gpu": ("cuda", "cuda")}


@dataclass(frozen=True)
class Device:
    """One device a group runs on: ``kind:index`` and the target its kernels are built for."""

    kind: str  # "cpu" or "cuda"
    index: int
    target: tvm.target.Target = field(compare=False, hash=False)

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.index}"

    def runtime_device(self) -> tvm.runtime.Device:
        return tvm.runtime.device(self.kind, self.index)

    def __str__(self) -> str:
        return self.name


def parse_device(spec: Any, group: str, default_target: tvm.target.Target) -> Device:
    """``"cpu:1"``, ``("cpu:1", target)`` or ``{"device": "cpu:1", "target": target}`` as a Device;
    an ``InputError`` naming the group for a spec that does not parse, a ``CompileError`` for a
    device kind this TVM build cannot run."""
    target = None
    if isinstance(spec, dict):
        unknown = set(spec) - {"device", "target"}
        if "device" not in spec or unknown:
            raise InputError(f"group2ctx['{group}'] = {spec!r}: a dict takes the keys 'device' (e.g. 'cpu:1') "
                             f"and optionally 'target'{f'; unknown keys {sorted(unknown)}' if unknown else ''}")
        spec, target = spec["device"], spec.get("target")
    elif isinstance(spec, tuple) and len(spec) == 2:
        spec, target = spec
    text = str(spec).strip().lower() if isinstance(spec, str) else None
    kind, _, index = (text or "").partition(":")
    if text is None or kind not in _KINDS or not (index == "" or index.isdigit()):
        raise InputError(f"group2ctx['{group}'] = {spec!r} is not a device: write 'cpu:0', 'cpu:1', ... "
                         f"or 'cuda:0' (optionally with its target: {{'device': 'cpu:1', 'target': 'x86-64'}})")
    runtime_kind, target_kind = _KINDS[kind]
    if not tvm.runtime.enabled(runtime_kind):
        raise CompileError(f"group2ctx['{group}'] = {spec!r}: this TVM build lacks {runtime_kind.upper()} "
                           f"(tvm.runtime.enabled('{runtime_kind}') is False), so it can neither run nor test "
                           f"kernels there; map the group to a 'cpu:N' device, or install a TVM built with "
                           f"{runtime_kind.upper()}")
    if target_kind != "llvm":
        raise CompileError(f"group2ctx['{group}'] = {spec!r}: tvm_ext schedules CPU kernels only; map the group "
                           "to a 'cpu:N' device")
    if target is None:
        target = default_target
    elif isinstance(target, str) and target not in ("llvm", "cpu", "host"):
        target = cpu_target(target, int(default_target.attrs.get("num-cores", 0)) or None)
    else:
        target = resolve_target(target)
    return Device(runtime_kind, int(index or 0), target)


@dataclass
class Placement:
    """One decision: ``node`` runs on ``device`` because of ``reason``."""

    node: str
    device: str
    reason: str  # "labelled dev2", "from input a", "reverse pass: ...", "default device", "input: ..."


@dataclass
class Copy:
    """One ``R.to_vdevice`` the pass inserted: ``value`` from ``source`` to ``destination``."""

    value: str
    source: str
    destination: str
    nbytes: int | None


@tvm.ir.transform.module_pass(opt_level=0, name="PlaceDevice")
class PlaceDevice:
    """Place ``func_name``'s nodes on devices and insert the copies (see the module docstring).

    ``group2ctx``: group -> device spec; ``labels``: node or input name -> group, besides the
    function's ``tvm_ext.ctx_group``; ``target``: the default device's (``cpu:0``) target.
    After it ran, ``decisions``, ``copies`` and ``devices`` (in VDevice order: the VM's device
    list, the default first) describe the result.
    """

    def __init__(self, group2ctx: dict[str, Any], labels: dict[str, str] | None = None,
                 target: Any = None, func_name: str = "main", registry: OpRegistry = OPS):
        self.target = resolve_target(target)
        if not isinstance(group2ctx, dict) or not group2ctx:
            raise InputError(f"group2ctx must be a non-empty dict {{group: device}}, got {group2ctx!r}")
        self.group2ctx = {str(g): parse_device(spec, str(g), self.target) for g, spec in group2ctx.items()}
        self.default = Device("cpu", 0, self.target)
        self.labels = dict(labels or {})
        self.func_name = func_name
        self.registry = registry
        self.decisions: list[Placement] = []
        self.copies: list[Copy] = []
        self.devices: list[Device] = []

    # ------------------------------------------------------------------ the pass
    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        func = mod[self.func_name]
        self.decisions, self.copies = [], []
        labels = self._labels(func)
        self.devices = self._device_list()
        self._vdevices = {d: VDevice(d.target, i, "global") for i, d in enumerate(self.devices)}  # one object each
        device_of = self._place(func, labels)
        self._check_mutations(func, device_of)
        new_func = self._rewrite(func, device_of)
        out = tvm.IRModule({gv: f for gv, f in mod.functions_items()}, attrs=mod.attrs,
                           global_infos=mod.global_infos)
        out[self.func_name] = relax.analysis.remove_all_unused(new_func)
        out.update_global_info("vdevice", [self._vdevice(d) for d in self.devices])
        out = relax.transform.CanonicalizeBindings()(relax.transform.RealizeVDevice()(out))
        return out.with_attr(attrs.DEVICES, [d.name for d in self.devices])

    def _labels(self, func: relax.Function) -> dict[str, str]:
        """Node or input name -> group, checked against ``group2ctx`` both ways."""
        labels = {}
        if func.attrs is not None and attrs.CTX_GROUP in func.attrs:
            labels = {str(k): str(v) for k, v in func.attrs[attrs.CTX_GROUP].items()}
        labels.update(self.labels)
        names = {p.name for p in func.params} | {b.var.name for blk in func.body.blocks for b in blk.bindings}
        for node, group in labels.items():
            if group not in self.group2ctx:
                raise InputError(f"node '{node}' is labelled with group '{group}', which group2ctx does not map "
                                 f"(it maps {sorted(self.group2ctx)}); add group2ctx['{group}'] = 'cpu:N'")
            if node in self.labels and node not in names:
                raise InputError(f"the device labels name '{node}', which is neither a node nor an input of "
                                 f"'{self.func_name}'")
        unused = sorted(set(self.group2ctx) - set(labels.values()))
        if unused:
            raise InputError(f"group2ctx maps group '{unused[0]}', but no node carries it (the groups used are "
                             f"{sorted(set(labels.values()))}); label nodes with sym.AttrScope(ctx_group="
                             f"'{unused[0]}') or with compile(..., device_labels={{name: '{unused[0]}'}})")
        return labels

    def _device_list(self) -> list[Device]:
        seen = [self.default]
        for d in self.group2ctx.values():
            if d not in seen:
                seen.append(d)
            elif any(o == d and str(o.target) != str(d.target) for o in seen):
                raise InputError(f"device {d.name} is given two targets in group2ctx (cpu:0, the caller's device, "
                                 f"has the compile target); give each device one")
        return seen

    def _vdevice(self, device: Device) -> VDevice:
        return self._vdevices[device]

    def _log(self, node: str, device: Device, reason: str) -> None:
        self.decisions.append(Placement(node, device.name, reason))

    def _place(self, func: relax.Function, labels: dict[str, str]) -> dict:
        """Each parameter and binding variable -> its Device (tuples have none)."""
        device_of: dict = {}
        for p in func.params:
            group = labels.get(p.name)
            device_of[p] = self.default
            self._log(p.name, self.default, "input: the caller's device" + (
                f" (labelled {group}: copied to {self.group2ctx[group]} where read there)" if group else ""))
        grad_of = {}
        if func.attrs is not None and attrs.GRAD_OF in func.attrs:
            grad_of = {str(k): str(v) for k, v in func.attrs[attrs.GRAD_OF].items()}
        bindings = [b for blk in func.body.blocks for b in blk.bindings]
        by_name = {b.var.name: b.var for b in bindings}
        known = set(func.params) | {b.var for b in bindings}
        reads = {b.var: [v for v in relax.analysis.free_vars(b.value) if v in known] for b in bindings}
        tuples = {b.var: b.value for b in bindings if isinstance(b.value, relax.Tuple)}  # containers: no device

        why: dict = {}
        for b in bindings:  # forward
            name = b.var.name
            if b.var in tuples:
                continue
            if isinstance(b.value, relax.TupleGetItem) and b.value.tuple_value in tuples:
                field = tuples[b.value.tuple_value].fields[b.value.index]
                if isinstance(field, relax.Var) and field in device_of:
                    device_of[b.var], why[b.var] = device_of[field], f"field of {b.value.tuple_value.name}"
                continue
            if name in labels:
                device_of[b.var], why[b.var] = self.group2ctx[labels[name]], f"labelled {labels[name]}"
            elif name in grad_of:
                continue  # a backward node: the reverse pass places it with its forward node
            else:
                placed = [v for v in reads[b.var] if v in device_of]
                if placed:
                    device_of[b.var], why[b.var] = device_of[placed[0]], f"from input {placed[0].name}"
        readers: dict = {}
        for b in bindings:
            if b.var in tuples:
                continue
            for v in reads[b.var]:
                readers.setdefault(v, []).append(b.var)
        for b in reversed(bindings):  # reverse
            if b.var in device_of or b.var in tuples:
                continue
            forward = by_name.get(grad_of.get(b.var.name, ""))
            if forward is not None and forward in device_of:
                device_of[b.var] = device_of[forward]
                why[b.var] = f"reverse pass: the gradient of {forward.name}"
                continue
            placed = [r for r in readers.get(b.var, []) if r in device_of]
            if placed:
                device_of[b.var], why[b.var] = device_of[placed[0]], f"reverse pass: read by {placed[0].name}"
        for b in bindings:
            if b.var in tuples:
                continue
            if b.var not in device_of:
                device_of[b.var], why[b.var] = self.default, "default device"
            self._log(b.var.name, device_of[b.var], why[b.var])
        return device_of

    def _check_mutations(self, func: relax.Function, device_of: dict) -> None:
        """The seed's legality check: an op may mutate an input only on the input's own device."""
        for blk in func.body.blocks:
            for b in blk.bindings:
                v = b.value
                if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)):
                    continue
                opdef = self.registry.get(v.op.name)
                for i in (opdef.mutates if opdef is not None else ()):
                    arg = v.args[i] if i < len(v.args) else None
                    if isinstance(arg, relax.Var) and device_of.get(arg) != device_of[b.var]:
                        raise PlacementError(
                            f"node '{b.var.name}' ({v.op.name}) mutates its input '{arg.name}' in place, but runs on "
                            f"{device_of[b.var]} while '{arg.name}' lives on {device_of.get(arg)}: a copy cannot "
                            f"carry an in-place update back; put both in one ctx_group")

    # ------------------------------------------------------------------ the new graph
    def _rewrite(self, func: relax.Function, device_of: dict) -> relax.Function:
        params = [relax.Var(p.name, _on(p.ty, self._vdevice(device_of[p]))) for p in func.params]
        env: dict = dict(zip(func.params, params))
        placed: dict = {new: device_of[old] for old, new in zip(func.params, params)}
        built: dict = {}  # a new tuple variable -> the Tuple it is bound to
        copies: dict = {}
        bb = relax.BlockBuilder()
        with bb.function(self.func_name, params, attrs=_kept_attrs(func)):
            with bb.dataflow():
                for blk in func.body.blocks:
                    for b in blk.bindings:
                        here = device_of.get(b.var)  # None for a tuple: its fields keep their devices
                        value = self._substitute(b.value, env, placed, here, copies, bb)
                        if here is not None and isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) \
                                and not _reads_tensor(value):  # constants only: they carry the device
                            vdevice = self._vdevice(here)
                            value = relax.Call(value.op, [_const_on(a, vdevice) for a in value.args], value.attrs,
                                               value.ty_args)
                        emit = bb.emit if isinstance(b.var, relax.DataflowVar) else bb.emit_output
                        new = emit(value, name_hint=b.var.name)
                        env[b.var] = new
                        if here is not None:
                            placed[new] = here
                        if isinstance(value, relax.Tuple):
                            built[new] = value
                result = self._returned(env.get(func.body.body, func.body.body), built, placed, copies, bb)
                result = _outputs(self._substitute(result, {}, placed, self.default, copies, bb), bb)
            bb.emit_func_output(result)
        return bb.get()[self.func_name]

    def _returned(self, expr, built: dict, placed: dict, copies: dict, bb):
        """The function's result with each tuple it returns rebuilt from its fields, so that
        every returned tensor can be copied back to the caller's device."""
        if isinstance(expr, relax.Var) and expr in built:
            expr = built[expr]
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self._returned(f, built, placed, copies, bb) for f in expr.fields])
        return expr

    def _substitute(self, expr, env, placed, here, copies, bb):
        """``expr`` with its variables renamed, and each tensor on another device than ``here``
        (None: any) read through its one copy to ``here``."""
        def visit(e):
            if isinstance(e, relax.Var):
                new = env.get(e, e)
                src = placed.get(new)
                if here is None or src is None or src == here or not isinstance(new.ty, relax.TensorType):
                    return new
                key = (new, here)
                if key not in copies:
                    copies[key] = bb.emit(relax.op.to_vdevice(new, self._vdevice(here)),
                                          name_hint=f"{new.name}_to_{here.kind}{here.index}")
                    placed[copies[key]] = here
                    self.copies.append(Copy(new.name, src.name, here.name, tensor_type_bytes(new.ty)))
                return copies[key]
            if isinstance(e, relax.Tuple):
                return relax.Tuple([visit(f) for f in e.fields])
            if isinstance(e, relax.TupleGetItem):
                return relax.TupleGetItem(visit(e.tuple_value), e.index)
            if isinstance(e, relax.Call):
                return relax.Call(e.op, [visit(a) for a in e.args], e.attrs, e.ty_args)
            return e
        return visit(expr)

    def table(self) -> str:
        """The decisions and copies, for people."""
        rows = [f"{p.node:28s} -> {p.device:7s} ({p.reason})" for p in self.decisions]
        rows += [f"copy {c.value} {c.source} -> {c.destination}"
                 + (f" ({c.nbytes} B)" if c.nbytes is not None else "") for c in self.copies]
        return "\n".join(rows)


def _on(ty, vdevice: VDevice):
    if isinstance(ty, relax.TensorType):
        return relax.TensorType(ty.shape, ty.dtype, vdevice) if ty.shape is not None else \
            relax.TensorType(ndim=ty.ndim, dtype=ty.dtype, vdevice=vdevice)
    if isinstance(ty, relax.TupleType):
        return relax.TupleType([_on(f, vdevice) for f in ty.fields])
    return ty


def _outputs(expr, bb: relax.BlockBuilder):
    """The function's result with every dataflow variable (a copy back) made a block output."""
    if isinstance(expr, relax.DataflowVar):
        return bb.emit_output(expr)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_outputs(f, bb) for f in expr.fields])
    return expr


_CONSTANT = type(relax.const(0.0))


def _const_on(arg, vdevice: VDevice):
    """A constant argument typed on ``vdevice``, so that inference places the call there."""
    if isinstance(arg, _CONSTANT) and isinstance(arg.ty, relax.TensorType):
        return _CONSTANT(arg.value, relax.TensorType(arg.ty.shape, arg.ty.dtype, vdevice))
    return arg


def _reads_tensor(call: relax.Call) -> bool:
    return any(isinstance(v.ty, relax.TensorType | relax.TupleType) for v in relax.analysis.free_vars(call))


def _kept_attrs(func: relax.Function) -> dict:
    """The function's attributes but the labels, which the placement now carries (VDevice)."""
    if func.attrs is None:
        return {}
    return {str(k): v for k, v in func.attrs.items() if str(k) not in (attrs.CTX_GROUP, attrs.GRAD_OF)}


__all__ = ["Copy", "Device", "PlaceDevice", "Placement", "PlacementError", "parse_device"]
