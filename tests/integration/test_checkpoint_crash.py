"""Crash test of the checkpoint store: SIGKILL a saving process, reopen, check.

For each durability mode that promises durability on return (``sync`` and
``group``), a child process saves checkpoints in a loop and acknowledges each
one on a pipe (see ``crash_child.py``). The test kills it with SIGKILL at a
random moment, at least 20 times, and after every kill reopens the store and
checks that every acknowledged checkpoint is there with the exact bytes acked,
that every stored record passes its checksum (no torn record), and that
``load_latest`` returns a valid checkpoint for every task.

SIGKILL tests process-crash atomicity; it cannot lose the OS page cache, so it
does not stand in for a power cut. The seed is printed on failure.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node_agent.checkpoint import CheckpointStore

CHILD = Path(__file__).with_name("crash_child.py")
KILLS = 22


def _run_and_kill(data_dir: Path, mode: str, seed: int, rng: random.Random) -> list[str]:
    """Start the child, SIGKILL it at a random moment, return every full ACK line."""
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(data_dir), mode, str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        ready = proc.stdout.readline()
        if ready == b"READY\n":
            time.sleep(rng.uniform(0.005, 0.35))
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read()
        proc.wait(timeout=10)
        errors = proc.stderr.read().decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    assert ready == b"READY\n", f"child did not start: {ready!r}\n{errors}"
    assert proc.returncode == -signal.SIGKILL
    return [line for line in rest.decode().split("\n")[:-1] if line.startswith("ACK ")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["sync", "group"])
def test_acknowledged_checkpoints_survive_sigkill(tmp_path: Path, mode: str) -> None:
    seed = int(os.environ.get("LAZARUS_CRASH_SEED", random.randrange(2**32)))
    print(f"crash test seed={seed} (rerun with LAZARUS_CRASH_SEED={seed})")
    rng = random.Random(seed)
    acked: dict[str, str] = {}
    for kill in range(KILLS):
        lines = _run_and_kill(tmp_path, mode, seed + kill, rng)
        for line in lines:
            _, ref, digest, _covers = line.split()
            acked[ref] = digest
        with CheckpointStore(tmp_path, durability=mode) as store:
            report = store.verify()
            assert report.ok, f"seed={seed} kill={kill}: torn/corrupt records {report}"
            for ref, digest in acked.items():
                got = store.load(ref)
                assert hashlib.sha256(got.payload).hexdigest() == digest, (
                    f"seed={seed} kill={kill}: {ref} holds other bytes than were acknowledged"
                )
            for head in store.task_heads():
                latest = store.load_latest(head.task_id)
                if head.last_checkpoint_seq:
                    assert latest is not None
                    assert latest.seq == head.last_checkpoint_seq
                listed = [i.seq for i in store.list(head.task_id)]
                assert sorted(listed) == list(range(1, head.last_checkpoint_seq + 1))
            assert store.corrupted_records == 0
    # the kills landed while saves were in flight, and many saves were acknowledged
    assert len(acked) >= KILLS
