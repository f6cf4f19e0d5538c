"""``torch.compile(model, backend="tvm_ext")``: TorchDynamo hands each graph it captures to
``tvm_ext_backend``, which compiles it with our pipeline; installing the package registers the
name (the ``torch_dynamo_backends`` entry point in ``setup.cfg``).

Dynamo passes a module's parameters and buffers as graph inputs. By default they stay inputs,
so that a later in-place update of a weight is seen (as Inductor does without freezing);
``options={"freeze": True}`` bakes them into the compiled model as constants instead, which
lets weight packing, BatchNorm folding and layout folding apply, for inference on weights that
no longer change. A graph we cannot compile runs eagerly, with a warning that says why; graph
breaks are Dynamo's own (each captured piece comes here separately).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import torch

from tvm_ext.errors import FrontendError

OPTIONS = ("fusion", "freeze", "target")


def tvm_ext_backend(gm: Any, example_inputs: Sequence[Any], **kwargs: Any) -> Callable:
    """A Dynamo backend: the FX graph ``gm`` compiled for ``example_inputs``, or ``gm.forward``
    (eager, with a warning) when it cannot be. Options (``torch.compile(..., options={...})``):
    ``fusion`` (default ``"autofuse"``), ``freeze`` (default False), ``target``."""
    options = dict(kwargs.get("options") or {})
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise FrontendError(f"unknown tvm_ext backend options {sorted(unknown)}; the options are {list(OPTIONS)}")
    try:
        return _compile_graph(gm, list(example_inputs), options)
    except Exception as err:  # noqa: BLE001 - any failure: this graph runs eagerly, and says why
        warnings.warn(f"tvm_ext backend: running a captured graph of {_op_count(gm)} ops eagerly: "
                      f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                      RuntimeWarning, stacklevel=2)
        return gm.forward


def _compile_graph(gm: Any, inputs: list, options: dict) -> Callable:
    import tvm_ext
    from tvm_ext.frontends import from_torch

    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise FrontendError(f"graph input {i} is a {type(x).__name__} (a dynamic size); tvm_ext compiles "
                                f"static shapes: pass torch.compile(..., dynamic=False)")
    if torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
        raise FrontendError("the graph needs gradients, and tvm_ext's backend compiles inference; call the "
                            "model under torch.no_grad() or torch.inference_mode()")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    frozen = _weights(placeholders, inputs) if options.get("freeze") else []
    live = [i for i in range(len(inputs)) if i not in frozen]
    module = _WithConstants(gm, {i: inputs[i] for i in frozen}, len(inputs))
    compiled = tvm_ext.compile(from_torch(module, tuple(inputs[i] for i in live)),
                               fusion=options.get("fusion", "autofuse"), target=options.get("target"))
    returns_tuple = _returns_sequence(gm)

    def run(*args):
        outs = compiled(*[args[i].detach().contiguous() for i in live])
        outs = outs if isinstance(outs, tuple) else (outs,)
        return outs if returns_tuple else outs[0]
    run.compiled = compiled  # for inspection: the report of what this graph became
    return run


def _weights(placeholders: list, inputs: list) -> list[int]:
    """Positions of the inputs Dynamo lifted from the module: its parameters and buffers."""
    return [i for i, (node, x) in enumerate(zip(placeholders, inputs))
            if isinstance(x, torch.nn.Parameter) or "_buffers_" in str(node.target)]


def _returns_sequence(gm: Any) -> bool:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return isinstance(out.args[0], (tuple, list))


def _op_count(gm: Any) -> int:
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


class _WithConstants(torch.nn.Module):
    """``gm`` with the inputs at ``constants`` held as buffers (exported as constants), taking
    the others positionally."""

    def __init__(self, gm: Any, constants: dict, arity: int):
        super().__init__()
        self.gm = gm
        self.arity = arity
        self.slots = sorted(constants)
        for k, i in enumerate(self.slots):
            self.register_buffer(f"c{k}", constants[i].detach().clone())

    def forward(self, *args):
        it = iter(args)
        full = [getattr(self, f"c{self.slots.index(i)}") if i in self.slots else next(it) for i in range(self.arity)]
        return self.gm(*full)
