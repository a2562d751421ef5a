"""Bootstraps: how the ranks of a group find each other at creation (and at close and destruction).

A bootstrap is any object with ``rank()``, ``size()``, ``all_gather(data: bytes) -> bytes`` (every rank's
bytes, concatenated in rank order; every rank passes as many) and ``barrier()``. None of them needs mpirun.
"""

from typing import Callable

from ._rocep import BootstrapError, ConfigError


class Callables:
    """A bootstrap from plain callables: ``all_gather(bytes) -> list[bytes] | bytes`` and ``barrier()``.
    ``rank`` must be this process's place in ``all_gather``'s output (a group's creation checks it)."""

    def __init__(self, rank: int, size: int, all_gather: Callable, barrier: Callable):
        if size < 1 or not 0 <= rank < size:
            raise ConfigError(f"bootstrap.Callables: rank = {rank}, size = {size} are invalid: allowed are "
                              f"size >= 1 and rank in [0, size - 1]")
        self._rank, self._size = rank, size
        self._all_gather, self._barrier = all_gather, barrier

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def all_gather(self, data: bytes) -> bytes:
        gathered = self._all_gather(bytes(data))
        return gathered if isinstance(gathered, (bytes, bytearray)) else b"".join(gathered)

    def barrier(self) -> None:
        self._barrier()


def from_mpi4py(comm) -> Callables:
    """A bootstrap over an mpi4py communicator."""
    return Callables(comm.Get_rank(), comm.Get_size(), comm.allgather, comm.Barrier)


def from_torch(group=None) -> Callables:
    """A bootstrap over a torch.distributed process group (None: the default group). The bytes travel by
    ``all_gather_object``, which any backend supports; give a gloo group to keep them off the GPU."""
    import torch.distributed as dist

    def all_gather(data: bytes):
        gathered = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, data, group=group)
        return gathered

    return Callables(dist.get_rank(group), dist.get_world_size(group), all_gather,
                     lambda: dist.barrier(group=group))


def gathered(bootstrap, data: bytes) -> bytes:
    """Every rank's `data` (all of one length) through `bootstrap.all_gather`, as the package's own
    collectives take it: an Exception it raises, or an answer of another length, becomes BootstrapError
    naming this rank, as it does in the library's collectives."""
    rank, expected = bootstrap.rank(), len(data) * bootstrap.size()
    try:
        answer = bytes(bootstrap.all_gather(data))
    except Exception as error:
        raise BootstrapError(f"rank {rank}: the bootstrap's all_gather failed: {type(error).__name__}: {error}") \
            from error
    if len(answer) != expected:
        raise BootstrapError(f"rank {rank}: the bootstrap's all_gather returned {len(answer)} bytes, expected "
                             f"{expected} (every rank's bytes, concatenated in rank order)")
    return answer

