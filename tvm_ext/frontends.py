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
            return from_exported_program(exported, keep_params_as_input=keep_params_as_input)
    except Exception as err:
        raise FrontendError(f"TVM's PyTorch importer failed on {name}: {_first_line(err)}") from err


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
