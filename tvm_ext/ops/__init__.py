"""Op registrations, one module per family. Importing this package fills ``OPS``."""
from tvm_ext.ops import anchors, elementwise, normalization, reduction, views  # noqa: F401
