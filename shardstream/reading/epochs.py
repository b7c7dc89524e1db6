"""Which epoch each pass over a dataset reads: the rule, and the shared memory that carries it
to DataLoader workers, persistent or not.

A *pass* is one iteration of the dataset by one reader: by the training process itself
(``num_workers=0``), or by each DataLoader worker once per DataLoader iterator. The rule:

- ``set_epoch(e)`` or ``load_state_dict(state)`` in the training process: the next pass of
  every reader reads epoch ``e`` (after a load: the state's epoch, from where it stopped).
- A pass that starts with no such call since the reader's previous pass reads the next epoch,
  the previous one plus one, as LitData's loaders do: a second pass never repeats an order
  unless told to. The first such pass warns once per dataset, since a loop that means to
  repeat an epoch must now say so.
- ``load_state_dict`` inside a DataLoader worker (torchdata's ``StatefulDataLoader`` handing
  each worker its saved state) applies to that worker's next pass only.

Why shared memory: a DataLoader copies the dataset into each worker when the worker starts, and
with ``persistent_workers=True`` that is once, so attributes set later in the training process
never reach them; nor is the training process told when a worker starts a pass. So the training
process writes its latest ``set_epoch`` / ``load_state_dict`` (a generation number and the
state as JSON) into a small file (:mod:`shardstream.storage.shm`) that every worker maps, and each reader
keeps a row of its own there: the generation it took last, the epoch of its latest pass, how
many passes it has started since that generation, and whether its latest pass ran to the end.
The workers of one DataLoader iterator each start one pass, so their rows agree (checked when a
pass starts); the training process reads the rows to know which epoch is in progress, for
``epoch``, ``len`` and ``state_dict``. Rows are kept per rank, so the processes of several
ranks that were handed one dataset object (Lightning's ``ddp_spawn`` / ``ddp_notebook``) keep
apart.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..storage.shm import SharedFile

__all__ = ["EpochBoard", "PassState", "warn_advanced"]

log = logging.getLogger("shardstream")

RANK_SLOTS = 16  # ranks sharing one dataset object at most (rank % RANK_SLOTS picks the block)
ROWS_PER_RANK = 257  # the training process, then up to 256 DataLoader workers
STATE_BYTES = 64 << 10  # JSON of the latest set_epoch / load_state_dict
_HEADER = 4  # int64: generation, flags (once), state length, unused
_ADVANCED = 1  # flag: a pass advanced the epoch by itself (warned)
_SEEN, _EPOCH, _PASSES, _FINISHED, _LOCAL, _LOADER = range(6)  # int64 columns of a reader's row
_COLUMNS = 6


@dataclass(frozen=True)
class PassState:
    """The epoch of a pass and the checkpoint segments it resumes from (``[]``: the epoch from
    its start; None: a worker's own loaded state, not known to the training process)."""

    epoch: int
    segments: list[dict[str, Any]] | None


@dataclass(frozen=True)
class PassView:
    """What the training process knows of its readers' passes (:meth:`EpochBoard.view`).

    ``latest`` is the pass in progress or, once every reader finished it, the one just read
    (before any pass since the latest ``set_epoch`` / ``load_state_dict``: the pass that call
    set up). ``started`` / ``finished``: whether readers have started / all finished it.
    """

    latest: PassState
    started: bool
    finished: bool

    @property
    def upcoming(self) -> PassState:
        """The pass a reader starting now would read (by the rule of the module doc)."""
        if self.finished:
            return PassState(self.latest.epoch + 1, [])
        return self.latest


class EpochBoard:
    """The shared epoch state of one dataset (module doc); created in the training process,
    re-opened by DataLoader workers."""

    def __init__(self) -> None:
        rows = RANK_SLOTS * ROWS_PER_RANK
        self._file = SharedFile("shardstream-epochs", (_HEADER + rows * _COLUMNS) * 8 + STATE_BYTES)
        self._arrays: tuple[np.ndarray, np.ndarray, memoryview] | None = None

    @property
    def path(self) -> str:
        return self._file.path

    def __getstate__(self) -> dict[str, object]:
        return {"_file": self._file, "_arrays": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)

    def _map(self) -> tuple[np.ndarray, np.ndarray, memoryview]:
        """``(header, rows, state bytes)`` views of the file."""
        if self._arrays is None:
            buffer = self._file.buffer()
            if buffer is None:
                raise RuntimeError(
                    f"{self._file.path}: the dataset's shared epoch file is gone: the training process that "
                    "created the dataset exited while this process used it"
                )
            rows = RANK_SLOTS * ROWS_PER_RANK
            header = np.ndarray((_HEADER,), dtype=np.int64, buffer=buffer)
            table = np.ndarray((rows, _COLUMNS), dtype=np.int64, buffer=buffer, offset=_HEADER * 8)
            state = memoryview(buffer)[(_HEADER + rows * _COLUMNS) * 8 :]
            self._arrays = (header, table, state)
        return self._arrays

    @staticmethod
    def _row(rank: int, worker_id: int | None) -> int:
        if worker_id is not None and not 0 <= worker_id < ROWS_PER_RANK - 1:
            raise ValueError(f"{worker_id=}: at most {ROWS_PER_RANK - 1} DataLoader workers per rank are supported")
        return (rank % RANK_SLOTS) * ROWS_PER_RANK + (0 if worker_id is None else worker_id + 1)

    def _read_state(self) -> PassState:
        header, _, state = self._map()
        data = json.loads(bytes(state[: int(header[2])]))
        return PassState(int(data["epoch"]), list(data["segments"]))

    def set(self, epoch: int, segments: list[dict[str, Any]]) -> tuple[int, PassState]:
        """In the training process: every reader's next pass reads ``epoch``, resuming
        ``segments`` (``[]``: from the epoch's start). Returns the new generation and state,
        which the caller keeps: DataLoader workers started from a copy of it take those."""
        data = json.dumps({"epoch": epoch, "segments": segments}).encode()
        if len(data) > STATE_BYTES:
            raise ValueError(
                f"the dataset state is {len(data)} bytes, more than {STATE_BYTES}: too many resumes in one epoch"
            )
        with self._file.lock():
            header, _, state = self._map()
            state[: len(data)] = data
            header[2] = len(data)
            header[0] += 1
            return int(header[0]), PassState(epoch, segments)

    def start_pass(
        self,
        *,
        rank: int,
        worker_id: int | None,
        num_workers: int,
        loaded: PassState | None,
        copied: tuple[int, PassState] | None,
        loader: int = 0,
    ) -> tuple[PassState, bool]:
        """A reader starts a pass: its epoch and segments by the rule, and whether this is the
        dataset's first pass that advanced the epoch on its own (the caller warns).

        Args:
            rank: this reader's rank.
            worker_id: its DataLoader worker id; None for the training process itself.
            num_workers: the DataLoader's workers (to check that they agree).
            loaded: a state loaded in this worker since its last pass (``StatefulDataLoader``).
            copied: for the first pass of a worker process, the generation and state its copy
                of the dataset was made with (when its DataLoader iterator was created), so a
                worker that starts late does not take a ``set_epoch`` made after that; None:
                the latest (the training process itself, or a persistent worker's next pass,
                which starts when the training process creates the next iterator).
            loader: which DataLoader worker processes this worker is one of (their shared
                base seed; persistent workers keep theirs), so workers of one DataLoader
                tell a sibling that has not started this pass yet from one of another
                DataLoader; 0: unknown.

        Raises:
            ValueError: the DataLoader's workers have read different numbers of passes since
                the latest ``set_epoch`` (the dataset was iterated by a DataLoader with another
                ``num_workers`` in between), so they would read different epochs.
        """
        with self._file.lock():
            header, rows, _ = self._map()
            gen, given = copied if copied is not None else (int(header[0]), None)
            me = rows[self._row(rank, worker_id)]
            first_advance = False
            if loaded is not None:
                state, me[_LOCAL], me[_PASSES] = loaded, 1, 1
            elif me[_SEEN] != gen or me[_PASSES] == 0:
                state, me[_LOCAL], me[_PASSES] = given or self._read_state(), 0, 1
            else:
                state, me[_LOCAL] = PassState(int(me[_EPOCH]) + 1, []), 0
                me[_PASSES] += 1
                first_advance = not header[1] & _ADVANCED
                header[1] |= _ADVANCED
            me[_SEEN], me[_EPOCH], me[_FINISHED], me[_LOADER] = gen, state.epoch, 0, loader
            if worker_id is not None and loaded is None:
                self._check_workers(rows, rank, num_workers, gen, int(me[_PASSES]), loader)
        return state, first_advance

    def _check_workers(self, rows: np.ndarray, rank: int, num_workers: int, gen: int, passes: int, loader: int) -> None:
        """Raise unless this DataLoader's workers agree: a sibling of the same worker processes
        has read ``passes`` or ``passes - 1`` passes since ``gen`` (it started this pass, or
        is about to); a row of other processes (an earlier DataLoader's, or none yet) exactly
        ``passes - 1``, which its worker of this DataLoader will take up from."""
        first = self._row(rank, 0)
        others = rows[first : first + num_workers]
        counts = np.where(others[:, _SEEN] == gen, others[:, _PASSES], 0)
        same = (others[:, _SEEN] == gen) & (others[:, _LOADER] == loader) if loader else np.ones(len(others), bool)
        if (counts[same] < passes - 1).any() or (counts[same] > passes).any() or (counts[~same] != passes - 1).any():
            raise ValueError(
                f"the {num_workers} DataLoader workers of this ShardDataset have read {counts.tolist()} passes since "
                "the last set_epoch(), so they would read different epochs: the dataset was iterated by a "
                "DataLoader with another num_workers in between. Call dataset.set_epoch(epoch) before each epoch"
            )

    def once(self, flag: int) -> bool:
        """True the first time any process of the dataset asks for ``flag`` (a bit > 1), so a
        message is logged once per dataset, not once per worker."""
        with self._file.lock():
            header = self._map()[0]
            first = not header[1] & flag
            header[1] |= flag
            return bool(first)

    def finish_pass(self, *, rank: int, worker_id: int | None) -> None:
        """A reader read its pass to the end."""
        with self._file.lock():
            self._map()[1][self._row(rank, worker_id), _FINISHED] = 1

    def view(self, *, rank: int, num_workers: int | None = None) -> PassView:
        """In the training process: the pass its readers are in (:class:`PassView`).

        Args:
            rank: this process's rank.
            num_workers: look only at the readers of a DataLoader with this many workers
                (0: the training process itself); None: at all readers of this rank.
        """
        with self._file.lock():
            header, rows, _ = self._map()
            gen = int(header[0])
            first = self._row(rank, None)
            if num_workers is None:
                block = rows[first : first + ROWS_PER_RANK]
            elif num_workers == 0:
                block = rows[first : first + 1]
            else:
                block = rows[first + 1 : first + 1 + num_workers]
            block = block[(block[:, _SEEN] == gen) & (block[:, _PASSES] > 0)]
            if len(block) == 0:
                return PassView(self._read_state(), started=False, finished=False)
            passes = int(block[:, _PASSES].max())
            latest = block[block[:, _PASSES] == passes]
            epoch = int(latest[:, _EPOCH].max())
            if passes > 1:
                segments: list[dict[str, Any]] | None = []
            elif latest[:, _LOCAL].any():
                segments = None
            else:
                segments = self._read_state().segments
            return PassView(PassState(epoch, segments), started=True, finished=bool(latest[:, _FINISHED].all()))


def warn_advanced(epoch: int) -> None:
    """Log (not ``warnings.warn``: a worker's filters may be the parent's) that a pass read
    ``epoch`` without ``set_epoch()`` (:meth:`EpochBoard.start_pass` says when, once a dataset)."""
    log.warning(
        "ShardDataset: a new pass started without set_epoch(), so it reads epoch %d (each pass without "
        "set_epoch() reads the next epoch, not the same order again). Call dataset.set_epoch(epoch) "
        "before each epoch to choose the epoch yourself.",
        epoch,
    )
