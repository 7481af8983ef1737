"""The eval prediction cache (`cache.jsonl` in the output folder): one record per (dataset, method, question), keyed
here, so the runner that writes it and the report that reads it share one key without importing each other."""

from __future__ import annotations

from pathlib import Path

from retrievers.jsonl import read_jsonl, repair


def cache_key(dataset: str, method: str, qid: str) -> str:
    return f"{dataset}\t{method}\t{qid}"


def read_cache(path: Path, repair_tail: bool = True) -> dict[str, dict]:
    """Cached records by key; a later record of the same key wins. A torn last line is skipped (and, with
    `repair_tail`, cut from the file so the next append starts on a fresh line; `--report_only` leaves it)."""
    if not path.exists():
        return {}
    if repair_tail:
        repair(path)
    return {cache_key(r["dataset"], r["method"], r["qid"]): r for r in read_jsonl(path, log=True)}
