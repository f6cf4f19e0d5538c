"""Graph passes over Relax (TVM 0.27 has no Relay; the package keeps the product's name).

Each pass is a ``tvm.ir.transform.Pass`` usable alone in a ``Sequential``:
``FoldWeightLayout`` (transpose weights once), ``MakeGroups`` (partition + outline
groups), ``FuseCompile`` (group -> one PrimFunc).
"""
from relay_passes.fold_weights import FoldWeightLayout
from relay_passes.fuse_compile import FuseCompile, lower_group
from relay_passes.graph import DataflowGraph
from relay_passes.grouping import MakeGroups
from relay_passes.partition import PARTITIONERS, Partition, partition_chains, partition_none

__all__ = ["DataflowGraph", "FoldWeightLayout", "FuseCompile", "MakeGroups", "PARTITIONERS", "Partition",
           "lower_group", "partition_chains", "partition_none"]
