"""The fusion strategies by name, as ``compile(..., fusion=NAME)`` and ``MakeGroups`` take them."""
from __future__ import annotations

from relay_passes.fuse_partition import FusePartition
from relay_passes.graph import DataflowGraph
from relay_passes.partition import Partition, Partitioner, partition_chains, partition_each, partition_none


def partition_nnvm(graph: DataflowGraph) -> Partition:
    """NNVM's fusion (master / root / pattern, diamond fusion), default settings."""
    return FusePartition()(graph)


PARTITIONERS: dict[str, Partitioner] = {
    "nnvm": partition_nnvm,
    "chains": partition_chains,
    "none": partition_none,
    "each": partition_each,
}
