"""The one JSONL module: reading with file:line errors, appending whole records with fsync, atomic whole-file writes,
and the torn-line policy that every reader and writer of the tree follows.

Torn-line policy. A record of a file we append to (a log: `kbrouter run` trajectories, the eval cache, retrieval
snapshots, the synthesis outputs and their commit log) is finished when its newline is written, so the bytes after
the last newline of a log are a *torn tail*: a record whose writer was killed while writing it, never a finished one.

- A reader of a log (`iter_jsonl_objects(path, log=True)`) skips a torn tail with a warning and leaves the file as
  it is (the writer may still be running).
- An appender (`JsonlWriter`, `append_jsonl`) first cuts it (`repair`), so its first record starts on a fresh line.
- A line that is not a JSON object anywhere else is an error naming `path:line`.

Input files (corpora, question and dataset files, index docs) are read with `log=False`: there a last line without
a newline is a line like any other (editors leave it off), and a broken one is an error naming `path:line`.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

_TAIL_BLOCK = 8192  # bytes read per step backwards from the end when looking for the last newline


def dumps_line(record: dict, *, sort_keys: bool = False) -> str:
    """One JSONL line of a record: UTF-8 text with non-ASCII kept, ending in a newline."""
    return json.dumps(record, ensure_ascii=False, sort_keys=sort_keys) + "\n"


def iter_jsonl_objects(path: str | Path, *, log: bool = False, end: int | None = None) -> Iterator[tuple[int, dict]]:
    """Yield `(line_number, row)` for each non-blank line of a JSONL file whose lines are JSON objects.

    Uses Python's parser (it accepts the bare `NaN` of the paper's Dyn-VQA file, which strict parsers reject).

    Args:
        path: the file.
        log: the file is one records are appended to: a torn tail (see the module docstring) is skipped with a
            warning instead of being read.
        end: read only the first `end` bytes (the committed part of a commit-logged file).

    Raises:
        ValueError: a line is not UTF-8, not JSON, or not an object; the message names `path:line` and the fix.
    """
    with Path(path).open("rb") as f:
        lines = f if end is None else io.BytesIO(f.read(end))
        for n, raw in enumerate(lines, 1):
            if log and not raw.endswith(b"\n"):
                logger.warning("%s:%d: skipping a torn last line (%d bytes) of a writer killed mid-record",
                               path, n, len(raw))  # fmt: skip
                return
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}:{n}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                    "save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno}); fix or remove the line"
                ) from e
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
            yield n, row


def read_jsonl(path: str | Path, *, log: bool = False) -> list[dict]:
    """The rows of a JSONL file (`iter_jsonl_objects` without line numbers)."""
    return [row for _, row in iter_jsonl_objects(path, log=log)]


def _torn_tail_size(f: io.BufferedRandom) -> int:
    """Bytes after the last newline of an open binary file."""
    size = pos = f.seek(0, os.SEEK_END)
    while pos > 0:
        start = max(0, pos - _TAIL_BLOCK)
        f.seek(start)
        i = f.read(pos - start).rfind(b"\n")
        if i >= 0:
            return size - (start + i + 1)
        pos = start
    return size


def repair(path: str | Path) -> int:
    """Cut the torn tail (see the module docstring) off a log about to be appended to; returns the bytes cut."""
    path = Path(path)
    if not path.exists():
        return 0
    with path.open("r+b") as f:
        cut = _torn_tail_size(f)
        if cut:
            f.truncate(f.seek(0, os.SEEK_END) - cut)
            logger.warning("%s: cut a torn last line (%d bytes) left by a writer killed mid-record", path, cut)
    return cut


def append_jsonl(path: str | Path, rows: Iterable[dict], *, fsync: bool = True) -> int:
    """Append whole records in one write (a torn tail is cut first) and flush, fsync unless told not to.

    Returns:
        The file's size after them (what a commit line records).
    """
    path = Path(path)
    repair(path)
    data = "".join(dumps_line(r) for r in rows).encode("utf-8")
    with path.open("ab") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
        return f.tell()


class JsonlWriter:
    """Appends one record per line to a log; each line is written whole and flushed, fsync'd every `fsync_every`.

    Opening cuts a torn tail a crash left (`repair`). Use as a context manager.
    """

    def __init__(self, path: str | Path, fsync_every: int = 1) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair(self.path)
        self._f = self.path.open("a", encoding="utf-8")
        self._n = 0
        self.fsync_every = fsync_every

    def write(self, record: dict) -> None:
        """Append one record."""
        self._f.write(dumps_line(record))
        self._f.flush()
        self._n += 1
        if self.fsync_every and self._n % self.fsync_every == 0:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        """Flush, fsync and close."""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict]) -> None:
    """Replace `path` with one JSON line per row (UTF-8, non-ASCII kept), atomically: written under a temporary name,
    fsync'd and renamed, so a crash leaves the previous file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(dumps_line(r) for r in rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves no temporary file behind
