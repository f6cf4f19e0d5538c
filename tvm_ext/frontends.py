"""Frontends: a PyTorch module, an ONNX model, a Symbol or a Relax IRModule becomes one IRModule."""
from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Sequence

import tvm

from tvm_ext.errors import FrontendError
from tvm_ext.symbol import Symbol


def from_torch(module: Any, example_inputs: Sequence[Any], keep_params_as_input: bool = False) -> tvm.IRModule:
    """``torch.export`` the module on ``example_inputs`` and import it with TVM's importer.

    The module is put in eval mode; its weights become constants of the IRModule.
    """
    import torch

    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    example_inputs = tuple(torch.as_tensor(x) if not isinstance(x, torch.Tensor) else x for x in example_inputs)
    module.eval()
    shapes = [tuple(x.shape) for x in example_inputs]
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")  # logs a traceback per failure
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        with torch.no_grad():
            exported = torch.export.export(module, example_inputs)
    except Exception as err:
        raise FrontendError(f"torch.export failed for {type(module).__name__} on example inputs of "
                            f"shapes {shapes}: {_first_line(err)}. Check that the example inputs have "
                            "the shapes and dtypes forward() expects.") from err
    finally:
        fake_log.setLevel(level)
    return from_exported(exported, keep_params_as_input, type(module).__name__)


def from_exported(exported: Any, keep_params_as_input: bool = False, name: str = "the exported program"
                  ) -> tvm.IRModule:
    """Import a ``torch.export.ExportedProgram`` with TVM's importer."""
    from tvm.relax.frontend.torch import from_exported_program

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return from_exported_program(exported, keep_params_as_input=keep_params_as_input,
                                         custom_convert_map=TORCH_CONVERTERS)
    except Exception as err:
        raise FrontendError(f"TVM's PyTorch importer failed on {name}: {_first_line(err)}") from err


def _extreme(op):
    """A converter for ``aten.amax`` / ``aten.amin`` (x, dim=(), keepdim=False), which TVM's
    importer lacks: a max / min reduction over ``dim`` (all dims when empty)."""
    def convert(node, importer):
        from tvm import relax

        args = importer.retrieve_args(node)
        dim = args[1] if len(args) > 1 else node.kwargs.get("dim", ())
        keepdim = args[2] if len(args) > 2 else node.kwargs.get("keepdim", False)
        axes = None if dim in ((), [], None) else [int(d) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
        return importer.block_builder.emit(op(args[0], axes, keepdims=bool(keepdim)))
    return convert


def _linear(node, importer):
    """``aten.linear`` in its input's dtype (TVM's converter makes every product float32, which
    a float16 or bfloat16 bias then cannot be added to)."""
    from tvm import relax

    args = importer.retrieve_args(node)
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    return importer.block_builder.emit(relax.op.linear(x, weight, bias, str(x.ty.dtype)))


def _addmm(node, importer):
    """``aten.addmm``: beta * bias + alpha * (a @ b), in the operands' dtype (see ``_linear``)."""
    from tvm import relax

    bias, a, b = (importer.env[n] for n in node.args[:3])
    alpha, beta = node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
    emit, dtype = importer.block_builder.emit, str(a.ty.dtype)
    out = emit(relax.op.matmul(a, b, out_dtype=dtype)) if alpha != 0 else None
    if out is not None and alpha != 1:
        out = emit(relax.op.multiply(out, relax.const(alpha, dtype)))
    if beta == 0:
        return out
    scaled = bias if beta == 1 else emit(relax.op.multiply(bias, relax.const(beta, str(bias.ty.dtype))))
    return scaled if out is None else emit(relax.op.add(scaled, out))


def _torch_converters() -> dict:
    from tvm import relax
    return {"amax.default": _extreme(relax.op.max), "amin.default": _extreme(relax.op.min),
            "linear.default": _linear, "addmm.default": _addmm}


TORCH_CONVERTERS = _torch_converters()  # ours, for the aten ops TVM's importer does not convert


def from_onnx(model: Any, shape_dict: dict[str, Sequence[int]] | None = None) -> tvm.IRModule:
    """Import an ONNX ModelProto (or a path to one) with TVM's ONNX frontend."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx as _from_onnx

    if isinstance(model, (str, os.PathLike)):
        try:
            model = onnx.load(str(model))
        except Exception as err:
            raise FrontendError(f"cannot read ONNX model {model}: {_first_line(err)}") from err
    try:
        return _from_onnx(model, shape_dict=dict(shape_dict) if shape_dict else None)
    except Exception as err:
        raise FrontendError(f"TVM's ONNX importer failed: {_first_line(err)}") from err


def import_model(model: Any, example_inputs: Sequence[Any] | None = None,
                 shape_dict: dict[str, Sequence[int]] | None = None,
                 keep_params_as_input: bool = False) -> tvm.IRModule:
    """Dispatch on the model's kind: IRModule, torch.nn.Module, ExportedProgram, ONNX model,
    ``.onnx`` path or Symbol."""
    if isinstance(model, tvm.IRModule):
        return model
    if isinstance(model, Symbol):  # shape_dict: the shapes of some inputs; the rest are inferred
        return model.to_relax(shapes=dict(shape_dict or {}))
    if isinstance(model, (str, os.PathLike)) and str(model).endswith(".onnx"):
        return from_onnx(model, shape_dict)
    kind = f"{type(model).__module__}.{type(model).__name__}"
    if kind.startswith("onnx"):
        return from_onnx(model, shape_dict)
    if kind == "torch.export.exported_program.ExportedProgram":
        return from_exported(model, keep_params_as_input)
    if _is_torch_module(model):
        if example_inputs is None:
            raise FrontendError("a torch.nn.Module needs example_inputs (a tuple of tensors) to be exported")
        return from_torch(model, example_inputs, keep_params_as_input)
    raise FrontendError(f"cannot compile a {kind}: pass a tvm.IRModule (Relax), a torch.nn.Module "
                        "with example_inputs, a torch.export.ExportedProgram, an onnx.ModelProto, a path to a .onnx file or a "
                        "tvm_ext.sym Symbol with shape_dict")


def _is_torch_module(model: Any) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(model, torch.nn.Module)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0].rstrip(".") if text else type(err).__name__
