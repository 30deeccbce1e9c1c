"""A rank that stops the job says why first: before MPI_Abort it waits until the launcher has
read its line from the output pipe (toolkit/distributed/faults.py), since the launcher stops
every process at the abort and what it had not read was lost."""
from __future__ import annotations

import contextlib
import os
import threading
import time

from toolkit.distributed.faults import wait_until_read


@contextlib.contextmanager
def _pipe_holding(line: str):
    """A pipe with ``line`` written and not yet read: (the written stream, the read end's fd)."""
    read_end, write_end = os.pipe()
    try:
        with os.fdopen(write_end, "w", closefd=False) as stream:
            stream.write(line)
            stream.flush()
            yield stream, read_end
    finally:
        os.close(read_end)
        os.close(write_end)


def test_the_wait_ends_when_the_reader_has_read_the_pipe():
    with _pipe_holding("error: rank 1 of 2: the reason\n") as (stream, read_end):
        read_at = []

        def reader():
            time.sleep(0.3)
            read_at.append(time.monotonic())
            os.read(read_end, 4096)
        thread = threading.Thread(target=reader)
        thread.start()
        assert wait_until_read(stream, limit_s=10.0)
        returned_at = time.monotonic()
        thread.join()
    assert read_at and returned_at >= read_at[0]


def test_a_pipe_no_one_reads_ends_the_wait_at_its_limit():
    with _pipe_holding("unread\n") as (stream, _read_end):
        started = time.monotonic()
        assert not wait_until_read(stream, limit_s=0.2)
        assert 0.2 <= time.monotonic() - started < 5.0


def test_a_stream_that_is_no_pipe_does_not_wait(tmp_path):
    with open(tmp_path / "log", "w") as stream:
        stream.write("x\n")
        assert wait_until_read(stream, limit_s=10.0)
