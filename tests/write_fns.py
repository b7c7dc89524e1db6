"""Functions for pack_samples tests: module-level, so spawned workers can unpickle them.

Run as a script, it packs ``samples_of`` over ``range(N)`` into DEST (the kill tests start it
as a process and SIGKILL it mid-pack):

    python tests/write_fns.py DEST NUM_INPUTS WORKERS MAX_SAMPLES_PER_SHARD
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from typing import Any

FLAG_ENV = "SHARDSTREAM_TEST_FLAG"


def payload(i: int, j: int) -> bytes:
    """Deterministic bytes of 200-2,200 bytes for sample ``j`` of input ``i``."""
    seed = hashlib.sha256(f"{i}/{j}".encode()).digest()
    return (seed * 70)[: 200 + (i * 37 + j * 11) % 2000]


def samples_of(i: int) -> list[dict[str, Any]] | None:
    """0 to 4 samples per input (every 11th gives none): shard limits fall inside inputs."""
    if i % 11 == 5:
        return None
    return [
        {"__key__": f"{i:05d}_{j}", "bin": payload(i, j), "cls": i % 10, "json": {"i": i, "j": j}}
        for j in range(1 + i % 4)
    ]


def one_sample(i: int) -> dict[str, Any]:
    return {"__key__": f"{i:06d}", "bin": payload(i, 0), "cls": i % 7}


def generated(i: int) -> Any:
    """A generator of samples (pack_samples takes generators as well as lists)."""
    yield from samples_of(i) or []


def fails_while_flagged(i: int) -> list[dict[str, Any]] | None:
    """Raises on input 37 while the file named by $SHARDSTREAM_TEST_FLAG exists."""
    if i == 37 and os.path.exists(os.environ[FLAG_ENV]):
        raise RuntimeError(f"flagged input {i}")
    return samples_of(i)


def dies_while_flagged(i: int) -> list[dict[str, Any]] | None:
    """SIGKILLs its own worker on input 150 while the flag file exists."""
    if i == 150 and os.path.exists(os.environ[FLAG_ENV]):
        os.kill(os.getpid(), signal.SIGKILL)
    return samples_of(i)


def bad_values(i: int) -> Any:
    """Input 3 raises, input 4 gives a value no extension holds, input 6 a bad key, and
    input 8 returns a str; the others are fine."""
    if i == 3:
        raise ValueError("no such row")
    if i == 4:
        return {"__key__": f"{i:03d}", "bin": object()}
    if i == 6:
        return {"__key__": "a.b", "bin": b"x"}
    if i == 8:
        return "not a sample"
    return one_sample(i)


if __name__ == "__main__":
    from shardstream import pack_samples

    dest, num_inputs, workers, per_shard = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    report = pack_samples(
        samples_of, range(num_inputs), dest, workers=workers, max_samples_per_shard=per_shard, progress=False
    )
    print(report.summary())
