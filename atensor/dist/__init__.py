"""Processes and hosts: data parallel training over MPI ranks (see processes.py, collective.py and profile.py).

    world = atensor.dist.init(devices=("CPU:0", "CPU:1"))   # rank and size from MPI, or one process
    x = Tensor(world.shard_batch(batch))                    # this process's rows of the global batch
    loss.backward(); atensor.dist.allreduce_gradients(opt); await opt.step(loss)
"""
from atensor.dist.collective import allreduce, allreduce_gradients
from atensor.dist.processes import REQUIRED_THREAD_LEVEL, DistError, World, init, launched_by_mpi, world

__all__ = ["allreduce", "allreduce_gradients", "REQUIRED_THREAD_LEVEL", "DistError", "World", "init",
           "launched_by_mpi", "world"]
