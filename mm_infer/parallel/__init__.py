"""Tensor parallelism: ranks in processes of their own, sharded layers, and the leader that keeps them in step."""
