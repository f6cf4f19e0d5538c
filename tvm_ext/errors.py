"""Errors a user can act on: each names the node (or input) and says what to do."""
from __future__ import annotations


class CompileError(Exception):
    """Base of every error this compiler raises on purpose."""


class NotLowerable(CompileError):
    """Our Loop-IR lowering does not handle this op instance; it keeps TVM's legalization.

    Raised inside lowerings (unsupported attribute, symbolic shape, dtype, ...). The
    pipeline catches it and falls back; users only see it in the fusion report.
    """


class ShapeError(CompileError, ValueError):
    """Shapes that do not fit together (broadcast, reshape, concat, matmul ...)."""


class UnsupportedOpError(CompileError):
    """An op that neither our registry nor TVM's LegalizeOps can turn into a kernel."""


class UnsupportedDtypeError(CompileError, TypeError):
    """A dtype that no kernel path here can compute."""


class DtypeError(CompileError, TypeError):
    """Dtypes that do not fit together (operands of one op, a parameter and its data)."""


class FrontendError(CompileError):
    """The model could not be imported (torch.export or the ONNX importer failed)."""


class InputError(CompileError, ValueError):
    """A call-time argument of the wrong count, shape or dtype."""


class ModelFileError(CompileError, OSError):
    """An exported model that cannot be loaded as it is: missing, truncated or changed."""


class PlacementError(InputError):
    """A device placement the seed's legality check rejects (an in-place mutation across devices)."""


def _register_with_ffi() -> None:
    """Keep our error types when they cross TVM's FFI (a pass raising inside ``Sequential``)."""
    import tvm_ffi

    for cls in (CompileError, NotLowerable, ShapeError, UnsupportedOpError, UnsupportedDtypeError,
                DtypeError, FrontendError, InputError, ModelFileError, PlacementError):
        tvm_ffi.register_error(cls.__name__, cls)


_register_with_ffi()
