"""Tensor parallelism on the CPU harness: SGLang's process groups without CUDA communicators.

SGLang 0.5.23 creates its TP groups with ``use_pynccl`` on unless the platform says
otherwise, and the platform here is CUDA's (torch is a CUDA build), so a CPU server with
``--tp-size 2`` dies constructing a NCCL communicator. On the CPU SGLang's own all-reduce
already has a CPU path (``GroupCoordinator.all_reduce``: ``shm_allreduce`` when the CPU
kernel is there, else ``torch.distributed.all_reduce`` over the gloo device group); this
patch only turns the GPU communicators off so that path is taken.
"""

from __future__ import annotations

import functools

GPU_COMMUNICATORS = ("use_pynccl", "use_custom_allreduce", "use_mscclpp", "use_torch_symm_mem_allreduce")


def patch_parallel_state(module) -> None:
    original = module.init_model_parallel_group
    if getattr(original, "hvd_cpu_shim", False):
        return

    @functools.wraps(original)
    def init_model_parallel_group(*args, **kwargs):
        for name in GPU_COMMUNICATORS:
            kwargs[name] = False
        return original(*args, **kwargs)

    init_model_parallel_group.hvd_cpu_shim = True
    module.init_model_parallel_group = init_model_parallel_group
