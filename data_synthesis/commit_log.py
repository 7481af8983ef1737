"""The synthesis commit log: batches are committed by one line of `progress.jsonl` (DESIGN §6).

The records of a batch are appended to `trajectories.jsonl`, `rejected.jsonl` and `steps.jsonl` and fsync'd, then one
line is appended (and fsync'd) to `progress.jsonl` naming the batch and the byte size of each output file. That line
is the commit. On restart, `restore` drops a torn last line of `progress.jsonl` and truncates each output file to the
sizes of the last committed line, which removes both half-written lines and whole records of an uncommitted batch.
Lines are appended with `retrievers.jsonl.append_jsonl` (its returned size is what a commit records) and read with its
torn-line policy. The job, the shard merge and the summary all read and write the folder through this module.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from retrievers.jsonl import iter_jsonl_objects, read_jsonl, repair

logger = logging.getLogger(__name__)

OUTPUTS = ("trajectories.jsonl", "rejected.jsonl", "steps.jsonl")
PROGRESS, MANIFEST, SKIPPED = "progress.jsonl", "manifest.json", "skipped.jsonl"


def atomic_write(path: Path, text: str) -> None:
    """Write a whole file under a temporary name, fsync, rename."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def read_progress(folder: Path) -> list[dict]:
    """Committed batch lines of `progress.jsonl`; a torn last line (a crash mid-commit) is not a commit."""
    path = folder / PROGRESS
    return read_jsonl(path, log=True) if path.exists() else []


def restore(folder: Path) -> list[dict]:
    """Roll the outputs back to the last commit; returns the committed progress lines."""
    repair(folder / PROGRESS)
    progress = read_progress(folder)
    sizes = progress[-1]["sizes"] if progress else {}
    for name in OUTPUTS:
        path = folder / name
        size = int(sizes.get(name, 0))
        if path.exists() and path.stat().st_size != size:
            if path.stat().st_size < size:
                raise RuntimeError(f"{path} is shorter ({path.stat().st_size} bytes) than its last commit ({size}); "
                                   "the output folder was modified outside the job; start a new output_dir")  # fmt: skip
            logger.info("%s: dropping %d uncommitted bytes", path, path.stat().st_size - size)
            with path.open("r+b") as f:
                f.truncate(size)
    return progress


def committed_rows(folder: Path, name: str, progress: list[dict]) -> list[dict]:
    """The records of output `name` up to the last commit of `progress` (a running job's uncommitted ones are left
    out)."""
    path = folder / name
    if not path.exists() or not progress:
        return []
    return [row for _, row in iter_jsonl_objects(path, log=True, end=int(progress[-1]["sizes"].get(name, 0)))]
