"""Tensor: takes the optimized Graph's fused groups; gives Tasks, each a ComputeDAG of tensor expressions built from
the ops' compute definitions, deduplicated by workload key, with the call plan of the model."""
