"""``WorkerPool``: a worker dropped from the pool gives back what it held at once.

A worker killed at a stop, found dead, or in excess releases its process
handle, its pipe and its spool reader when it is dropped, not at the next
metrics scrape (``checkpoint_stats``): with metrics off (the CLI's default)
an agent whose handlers ignore their stops would otherwise run out of file
descriptors (~500 kills at a limit of 1024). Its checkpoint counts stay in the
metrics, and its spool file is deleted only when no row is left in it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from node_agent.isolation import _STATS, Worker, WorkerPool
from node_agent.spool import SpoolReader, SpoolWriter


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _up(worker: Worker) -> None:
    """Wait until the worker process opened its spool (it runs its loop then)."""
    assert worker.spool is not None
    deadline = time.monotonic() + 30
    while not worker.spool.path.exists():
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.01)


def test_discarded_workers_release_fds_and_spools_without_a_scrape(tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    pool = WorkerPool(2, spool_dir=spool_dir)
    try:
        warm = pool.acquire()  # the pool's own first-use costs (the shared heap) come first
        _up(warm)
        pool.discard(warm)
        before = _fds()
        kills = 5
        for _ in range(kills):
            worker = pool.acquire()
            _up(worker)
            assert worker.spool is not None
            worker.spool.read()  # the agent reads a running worker's spool
            worker.shared[_STATS] += 1.0  # one local checkpoint in the first bucket
            pool.discard(worker)  # its handler ignored a stop: SIGKILL
            assert not worker.alive()
            assert "SIGKILL" in worker.death()
        # No checkpoint_stats() call (no scrape) before these checks.
        assert pool._started == [], "discarded workers are still held"
        assert _fds() <= before, f"fds grew by {_fds() - before} over {kills} kills"
        assert list(spool_dir.glob("*.db*")) == [], "empty spools of dead workers are left"
        counts, _ = pool.checkpoint_stats()["local"]
        assert counts[0] == kills, "a discarded worker's checkpoint counts were lost"
    finally:
        pool.close()


def test_released_and_dead_idle_workers_are_retired_too(tmp_path: Path) -> None:
    pool = WorkerPool(1, spool_dir=tmp_path / "spool")
    try:
        a, b = pool.acquire(), pool.acquire()
        _up(a)
        _up(b)
        pool.release(a)  # idle: kept
        pool.release(b)  # the idle pool is full: killed
        assert not b.alive()
        assert pool._started == [a]
        a.kill()  # an idle worker dies (OOM kill)
        c = pool.acquire()  # finds it dead, starts a new one
        assert c is not a
        assert pool._started == [c]
        for gone in (a, b):  # their spools held no row: deleted
            assert gone.spool is not None
            assert not gone.spool.path.exists()
    finally:
        pool.close()
    assert pool._started == []


def test_a_dead_workers_spool_with_rows_is_kept(tmp_path: Path) -> None:
    """A row not ingested yet (its relay ingests it after the kill, or an
    ingestion failed) keeps the file: the relay or the next start ingests it."""
    pool = WorkerPool(1, spool_dir=tmp_path / "spool")
    try:
        worker = pool.acquire()
        _up(worker)
        assert worker.spool is not None
        writer = SpoolWriter(worker.spool.path)  # as the worker's checkpoint would
        writer.append("t", 1, 1, 0, "", b'{"i": 1}')
        writer.close()
        pool.discard(worker)
        assert worker.spool.path.exists(), "a spool with an un-ingested row was deleted"
        (row,) = SpoolReader(worker.spool.path).read()
        assert row.payload == b'{"i": 1}'
        worker.spool.delete_through(row.id)  # ingested
        worker.release_spool()
        assert not worker.spool.path.exists()
    finally:
        pool.close()
