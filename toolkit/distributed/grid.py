"""The ranks of a job as data-parallel replicas of a pipeline: ``stages x replicas`` ranks
(docs/spec.md section 8, pipeline).

Replica r is ranks r*S .. r*S+S-1, rank r*S+s its stage s (replica-major): the ranks of one
pipeline are consecutive, so a launcher that fills a machine's slots in rank order puts a
pipeline on one machine, where its point-to-point messages (every micro-batch, on the step's
critical path) are cheapest, and the all-reduce (once a step, overlapped with the backward
pass) is what crosses machines. With one replica the layout is the pipeline's (rank = stage),
with one stage data parallelism's (rank = replica).

``PipelineGrid`` is the communicator the kernels of such a rank run on (distributed/comm.py's
``use``): a send or receive goes to a stage of its own replica (``pipe``, numbered by stage,
so the cut graph's peers are ranks there), a gradient bucket's or a logged loss's sum goes over
the replicas of its own stage (``across``, numbered by replica), and everything the trainer
agrees on (stopping, gathering the model, the ranks' pids) goes over the whole job.
"""
from __future__ import annotations

import numpy as np

from .comm import MpiCommunicator, Solo


def place(rank: int, stages: int) -> tuple[int, int]:
    """A rank's (stage, replica)."""
    return rank % stages, rank // stages


def replica_ranks(replica: int, stages: int) -> list[int]:
    """The ranks of one replica, by stage."""
    return list(range(replica * stages, (replica + 1) * stages))


def stage_ranks(stage: int, stages: int, replicas: int) -> list[int]:
    """The ranks that hold one stage, by replica (its gradients are summed among them)."""
    return [r * stages + stage for r in range(replicas)]


class PipelineGrid(Solo):
    """One rank of ``world`` (an MpiCommunicator) in a grid of ``stages`` stages x its size /
    ``stages`` replicas (see the module's docstring)."""

    launched = True

    def __init__(self, world: MpiCommunicator, stages: int):
        super().__init__()
        self.world = world
        self.rank, self.size = world.rank, world.size
        self.stages, self.replicas = stages, world.size // stages
        self.stage, self.replica = place(world.rank, stages)
        self.pipe = world.split(self.replica, self.stage)
        # the replicas' sums wait giving the core away while they poll, as a receive does: with
        # more ranks than cores, a rank spinning in MPI's wait would hold the core that the rank
        # it waits for needs
        self.across = world.split(self.stage, self.replica, yielding=True)

    # statistics: the time blocked, over every part
    @property
    def waited_s(self) -> float:
        return self.world.waited_s + self.pipe.waited_s + self.across.waited_s

    @waited_s.setter
    def waited_s(self, value: float) -> None:
        if hasattr(self, "across"):               # (Solo's __init__ sets it before the parts exist)
            self.world.waited_s = self.pipe.waited_s = self.across.waited_s = value

    @property
    def gradient_wait_s(self) -> float:
        return self.across.gradient_wait_s if hasattr(self, "across") else 0.0

    @gradient_wait_s.setter
    def gradient_wait_s(self, value: float) -> None:
        if hasattr(self, "across"):
            self.across.gradient_wait_s = value

    # the stages of this replica
    def send(self, peer: int, tag: int, array: np.ndarray) -> None:
        self.pipe.send(peer, tag, array)

    def finish_send(self, tag: int) -> None:
        self.pipe.finish_send(tag)

    def finish_sends(self) -> None:
        self.pipe.finish_sends()

    def recv(self, peer: int, tag: int, out: np.ndarray | None = None) -> np.ndarray:
        return self.pipe.recv(peer, tag, out)

    # the replicas of this stage
    def allreduce(self, array: np.ndarray) -> np.ndarray:
        return self.across.allreduce(array)

    def start_allreduce(self, bucket: int, flat: np.ndarray, out: np.ndarray | None = None) -> None:
        self.across.start_allreduce(bucket, flat, out)

    def wait_allreduce(self, bucket: int) -> np.ndarray:
        return self.across.wait_allreduce(bucket)

    def sum_floats(self, values: list[float]) -> list[float]:
        return self.across.sum_floats(values)

    # the whole job
    def largest(self, value: int) -> int:
        return self.world.largest(value)

    def broadcast(self, array: np.ndarray) -> None:
        self.world.broadcast(array)

    def share(self, value):
        return self.world.share(value)

    def pids(self) -> list[int]:
        return self.world.pids()

    def gather_all(self, value) -> list:
        return self.world.gather_all(value)

    def local_rank(self) -> int:
        return self.world.local_rank()

    def abort(self, code: int) -> None:
        self.world.abort(code)

