"""The fusion strategies by name, as ``compile(..., fusion=NAME)`` and ``MakeGroups`` take them."""
from __future__ import annotations

from relay_passes.autofuse import AutoFuse
from relay_passes.concretize_broadcast import concretize_broadcast
from relay_passes.fuse_partition import FusePartition
from relay_passes.graph import DataflowGraph
from relay_passes.partition import Partition, Partitioner, partition_chains, partition_each, partition_none


def partition_nnvm(graph: DataflowGraph) -> Partition:
    """NNVM's fusion (master / root / pattern, diamond fusion), then ConcretizeBroadcast."""
    return concretize_broadcast(FusePartition()(graph))


def partition_chains_concretized(graph: DataflowGraph) -> Partition:
    """Elementwise/broadcast trees, then ConcretizeBroadcast."""
    return concretize_broadcast(partition_chains(graph))


def partition_autofuse(graph: DataflowGraph) -> Partition:
    """AutoFuse's graph-level lowering (KernelBoxes, recompute, stop rules), default rules."""
    return AutoFuse()(graph)


PARTITIONERS: dict[str, Partitioner] = {
    "autofuse": partition_autofuse,
    "nnvm": partition_nnvm,
    "chains": partition_chains_concretized,
    "none": partition_none,
    "each": partition_each,
}
