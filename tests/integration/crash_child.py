"""Child process for the checkpoint crash test: save in a loop, ack each save.

Usage: python crash_child.py DATA_DIR MODE SEED

Four threads each own a task; each appends a few journal events, saves a
checkpoint whose payload is derived from the seed, and — only after ``save``
returned — prints ``ACK <ref> <sha256 of payload> <covers>`` on stdout. The
parent SIGKILLs this process at random moments; every ACK line it read names a
checkpoint that must survive.
"""

from __future__ import annotations

import hashlib
import random
import sys
import threading

from node_agent.checkpoint import Checkpoint, CheckpointStore


def main() -> None:
    data_dir, mode, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = CheckpointStore(data_dir, durability=mode)
    heads = {h.task_id: h for h in store.task_heads()}
    out_lock = threading.Lock()

    def work(worker: int) -> None:
        rng = random.Random(seed * 100 + worker)
        task_id = f"crash-task-{worker}"
        head = heads.get(task_id)
        epoch = 1 if head is None else head.epoch
        while True:
            last = 0
            for _ in range(rng.randint(1, 3)):
                last = store.append(task_id, rng.randbytes(rng.randint(0, 512)), epoch=epoch)
            size = rng.choice([1, 100, 1024, 64 * 1024, 256 * 1024])
            payload = rng.randbytes(size)
            out = store.save(Checkpoint(task_id, epoch, payload, covers_journal_seq=last))
            digest = hashlib.sha256(payload).hexdigest()
            with out_lock:
                sys.stdout.write(f"ACK {out.ref} {digest} {out.covers_journal_seq}\n")
                sys.stdout.flush()

    sys.stdout.write("READY\n")
    sys.stdout.flush()
    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
