"""The ranks of a data-parallel run agree on stopping after a signal: a signal that lands after
an iteration's agreement is acted on at the next iteration's, by every rank together (acting on
it at once, one rank would leave while the others went into the next step's collectives and
hang the job). Driven here through a stand-in communicator, so the signal's moment is exact."""
from __future__ import annotations

import signal

from toolkit.distributed.comm import Solo
from toolkit.frontend import Net
from toolkit.training.checkpoint import find_resume_point, read_checkpoint
from toolkit.training.trainer import Trainer


class TwoRanks(Solo):
    """Rank 0 of two whose collectives are the identity; the signal arrives during the
    agreement of iteration ``late_at`` (after the vote is cast), as a real one can."""
    size = 2
    other = 0                      # the other rank's vote: no signal

    def __init__(self, late_at: int):
        super().__init__()
        self.late_at, self.votes, self.trainer = late_at, [], None

    def largest(self, value: int) -> int:
        self.votes.append(value)
        if len(self.votes) - 1 == self.late_at:
            self.trainer._stop = signal.SIGINT
        return max(value, self.other)


class OtherRankSignalled(TwoRanks):
    """The other rank got SIGINT first (a launcher forwards a Ctrl-C to each rank in turn)."""
    other = int(signal.SIGINT)


def test_a_signal_after_the_agreement_stops_every_rank_at_the_next_iteration(tmp_path):
    net = Net.load("zoo/lenet/net.yaml", overrides=[(("train", "max_iter"), 50), (("train", "display"), 1)])
    comm = TwoRanks(late_at=3)
    trainer = Trainer(net, tmp_path / "run", comm=comm)
    comm.trainer = trainer
    assert trainer.run() == 128 + signal.SIGINT
    # voted "go on" four times, the signal landed during the fourth vote; the fifth says stop
    assert comm.votes == [0, 0, 0, 0, signal.SIGINT]
    assert read_checkpoint(find_resume_point(str(tmp_path / "run"))).iteration == 5


def test_a_rank_stopped_by_the_others_signal_exits_as_they_do(tmp_path):
    """The job's exit status is 130 whichever rank the Ctrl-C reached first: a rank that
    stops because another was signalled stops by that signal, not by a SIGTERM of its own."""
    net = Net.load("zoo/lenet/net.yaml", overrides=[(("train", "max_iter"), 50)])
    comm = OtherRankSignalled(late_at=-1)
    trainer = Trainer(net, tmp_path / "run", comm=comm)
    comm.trainer = trainer
    assert trainer.run() == 128 + signal.SIGINT
    assert comm.votes == [0]


def test_a_launched_rank_stopped_by_a_signal_ignores_the_copies_still_on_their_way(tmp_path):
    """The launcher signals every rank in turn and the ranks stop together at the first copy: a
    rank's own copy landing after its run has ended must not raise KeyboardInterrupt on its way
    out (it died of SIGINT, and the launcher killed the others: the job ended 9, not 130). A run
    that is not a launched rank, or that was not stopped by a signal, gets its handlers back."""
    net = Net.load("zoo/lenet/net.yaml", overrides=[(("train", "max_iter"), 50)])
    mine = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        comm = OtherRankSignalled(late_at=-1)
        comm.launched = True
        trainer = Trainer(net, tmp_path / "launched", comm=comm)
        comm.trainer = trainer
        assert trainer.run() == 128 + signal.SIGINT
        assert {s: signal.getsignal(s) for s in mine} == {s: signal.SIG_IGN for s in mine}
    finally:
        for s, handler in mine.items():
            signal.signal(s, handler)
    for comm, ends in ((OtherRankSignalled(late_at=-1), 128 + signal.SIGINT), (TwoRanks(late_at=-1), 0)):
        trainer = Trainer(net, tmp_path / f"{type(comm).__name__}", comm=comm)
        comm.trainer = trainer
        assert trainer.run() == ends
        assert {s: signal.getsignal(s) for s in mine} == mine
