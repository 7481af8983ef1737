"""JSONL reading and whole-file writing.

`iter_jsonl_objects` reads every input file (corpora, question and dataset files, index docs): errors name the file
and line. `write_jsonl_atomic` writes a whole file under a temporary name, fsyncs and renames it, so a crash leaves
the previous file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict]) -> None:
    """Replace `path` with one JSON line per row (UTF-8, non-ASCII kept), atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves no temporary file behind


def iter_jsonl_objects(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield `(line_number, row)` for each non-blank line of a JSONL file whose lines are JSON objects.

    Uses Python's parser (it accepts the bare `NaN` of the paper's Dyn-VQA file, which strict parsers reject).

    Raises:
        ValueError: a line is not UTF-8, not JSON, or not an object; the message names `path:line` and the fix.
    """
    with Path(path).open("rb") as f:
        for n, raw in enumerate(f, 1):
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
