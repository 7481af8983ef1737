"""Replayable retrieval: record every (KB, query, image, k) -> hits answer to a JSONL snapshot, then replay it.

An RL run, an eval or a benchmark recorded with the live indexes can be re-run bit-for-bit from the snapshot,
without loading any index or encoder. Both are explicit wrappers that satisfy `Retriever` (STYLE §7)::

    live = Recording(load_kb(cfg), "runs/snap.jsonl", kb=cfg.name)   # search() answers and appends
    again = Replay("runs/snap.jsonl", kb=cfg.name)                   # search() answers from the file

One snapshot file can hold several KBs. Each line is
`{"kb", "text", "image", "k", "hits": [Hit.to_dict(), ...]}`; scores are written with Python's shortest
round-trip float repr, so replayed hits equal the recorded ones exactly.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from retrievers.jsonl import append_jsonl, iter_jsonl_objects
from retrievers.types import Hit, Query, Retriever, as_queries

logger = logging.getLogger(__name__)

Key = tuple[str, str, str | None, int | None]


def snapshot_key(kb: str, query: Query, k: int | None) -> Key:
    """The lookup key of one answer."""
    return (kb, query.text, query.image, k)


class Recording:
    """Passes searches to `inner` and appends each (query -> hits) answer to the JSONL snapshot `path`.

    Several `Recording`s (one per KB, or several threads) may share one path: lines are appended whole under a
    per-path lock and flushed after every `search` call; a torn last line a killed recorder left is cut first.
    """

    _locks: dict[str, threading.Lock] = {}
    _locks_guard = threading.Lock()

    def __init__(self, inner: Retriever, path: str | os.PathLike, kb: str) -> None:
        self.inner = inner
        self.path = Path(path)
        self.name = kb
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with Recording._locks_guard:
            self._lock = Recording._locks.setdefault(str(self.path.resolve()), threading.Lock())

    def search(self, queries: list[str | Query], k: int | None = None) -> list[list[Hit]]:
        """Search `inner` and record the answers."""
        qs = as_queries(queries)
        results = self.inner.search(qs, k)
        rows = [
            {"kb": self.name, "text": q.text, "image": q.image, "k": k, "hits": [h.to_dict() for h in hits]}
            for q, hits in zip(qs, results, strict=True)
        ]
        with self._lock:
            append_jsonl(self.path, rows, fsync=False)
        return results


def read_snapshot(path: str | os.PathLike) -> dict[Key, list[dict]]:
    """Load a snapshot into {key: hit dicts}; a torn last line (interrupted write) is skipped with a warning."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"retrieval snapshot {str(path)!r} does not exist; record one with `Recording` "
            "or `kbrouter serve-retrieval --record`"
        )
    return {
        (row["kb"], row["text"], row["image"], row["k"]): row["hits"] for _, row in iter_jsonl_objects(path, log=True)
    }


class Replay:
    """Answers searches of KB `kb` from a snapshot; satisfies `Retriever` without any index.

    Raises `KeyError` on a query the snapshot does not hold (same KB, text, image and k).
    """

    def __init__(self, path: str | os.PathLike, kb: str) -> None:
        self.path = Path(path)
        self.name = kb
        self._answers = {key: hits for key, hits in read_snapshot(path).items() if key[0] == kb}
        logger.info("replaying %d answers of KB %s from %s", len(self._answers), kb, self.path)

    def __len__(self) -> int:
        return len(self._answers)

    def search(self, queries: list[str | Query], k: int | None = None) -> list[list[Hit]]:
        """The recorded hits of each query."""
        out = []
        for q in as_queries(queries):
            key = snapshot_key(self.name, q, k)
            if key not in self._answers:
                raise KeyError(
                    f"replay miss: KB {self.name!r} query {q.text!r} (image {q.image!r}, k {k!r}) is not in snapshot "
                    f"{str(self.path)!r}; re-record the run with the live indexes"
                )
            out.append([Hit.from_dict(h) for h in self._answers[key]])
        return out


def recording_kbs(kbs: dict[str, Retriever], path: str | os.PathLike) -> dict[str, Recording]:
    """Wrap every retriever of a KB dict (keyed by KB name) in a `Recording` to one snapshot."""
    return {name: Recording(r, path, name) for name, r in kbs.items()}


def replay_kbs(path: str | os.PathLike, names: list[str]) -> dict[str, Replay]:
    """A `Replay` per KB name, all from one snapshot."""
    return {name: Replay(path, name) for name in names}
