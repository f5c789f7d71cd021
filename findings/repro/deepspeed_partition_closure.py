"""DeepSpeed's partition_activations empties the checkpointed function's argument; a nested
checkpoint that reads it by closure recomputes from an uninitialized scalar.

With ``deepspeed.checkpointing.configure(mpu, partition_activations=True)``, checkpoint and
non_reentrant_checkpoint keep only this rank's slice of each floating tensor argument and set the
argument itself to ``torch.empty([])`` (get_partitioned_activations_for_backward) until that
checkpoint's own recompute gathers it back.  A non-reentrant checkpoint inside the function that
reads the argument by closure (``non_reentrant_checkpoint(lambda: block(h))``) and is recomputed
before the outer one (here: the outer function has no saved tensors of its own, so it never
recomputes) reruns ``block`` on that empty scalar: the dropout mask of the recompute has shape
(), and the weight gradient is computed from uninitialized memory.  No error, no warning.

One process (a gloo group of one, model-parallel size 1: partitioning still empties the
argument); the same on two ranks.

    python deepspeed_partition_closure.py

Needs torch and deepspeed (DS_ACCELERATOR=cpu or a GPU).  Exit 1 while the gradient differs from
the same function without partitioning.
"""
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
dist.init_process_group("gloo")

import deepspeed.comm as ds_comm  # noqa: E402
from deepspeed.runtime.activation_checkpointing import checkpointing  # noqa: E402

ds_comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)


class ModelParallel:
    """The mpu configure() asks for: the whole group is one model-parallel group."""

    def get_model_parallel_rank(self):
        return dist.get_rank()

    def get_model_parallel_world_size(self):
        return dist.get_world_size()

    def get_model_parallel_group(self):
        return dist.group.WORLD


def weight_gradient(partition: bool) -> torch.Tensor:
    checkpointing.configure(ModelParallel(), partition_activations=partition)
    weight = torch.ones(64, 64, requires_grad=True)

    def block(h):
        out, _ = torch.native_dropout(h * weight, 0.5, True)
        return out

    def layer(h):
        return checkpointing.non_reentrant_checkpoint(lambda: block(h))  # reads the argument by closure

    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    torch.manual_seed(1)
    checkpointing.non_reentrant_checkpoint(layer, x.clone()).sum().backward()
    return weight.grad


plain, partitioned = weight_gradient(False), weight_gradient(True)
same = torch.equal(plain.view(torch.int32), partitioned.view(torch.int32))
print(f"deepspeed partition_activations=True: weight gradient equal to partition_activations=False: {same}")
print(f"  first values: {partitioned.flatten()[:3].tolist()} (partitioned) vs {plain.flatten()[:3].tolist()}")
dist.destroy_process_group()
sys.exit(0 if same else 1)
