"""Graph passes over Relax (TVM 0.27 has no Relay; the package keeps the product's name).

Each pass is a ``tvm.ir.transform.Pass`` usable alone in a ``Sequential``:
``Gradient`` (reverse-mode autodiff), ``FoldWeightLayout`` (transpose weights once),
``PackMatmulWeights`` (constant matmul operands in column panels),
``MakeGroups`` (partition + outline groups; ``FusePartition`` is NNVM's fusion),
``FuseCompile`` (group -> one PrimFunc).
"""
from relay_passes.simplify import FoldTupleGetItem, FoldWeightLayout
from relay_passes.gradient import Gradient
from relay_passes.pack_weights import PackMatmulWeights
from relay_passes.fuse_compile import FuseCompile, lower_group
from relay_passes.graph import DataflowGraph
from relay_passes.grouping import MakeGroups
from relay_passes.fuse_partition import FusePartition, FusePlan
from relay_passes.partition import Partition, partition_chains, partition_none
from relay_passes.strategies import PARTITIONERS, partition_nnvm

__all__ = ["DataflowGraph", "FoldTupleGetItem", "FoldWeightLayout", "FuseCompile", "FusePartition", "FusePlan", "Gradient",
           "MakeGroups", "PARTITIONERS", "PackMatmulWeights", "Partition", "lower_group", "partition_chains",
           "partition_nnvm", "partition_none"]
