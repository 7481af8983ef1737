"""Concatenate step-record files into one training file, renaming each source's datasets with a prefix.

A recipe's `max_per_dataset` caps records by `metadata.dataset`; with two sources of the same datasets (the annotation
teacher's records and a self-distillation run's), a prefix gives each source its own caps:

    python scripts/mix_steps.py --out runs/synth/rft_mix/steps_train.jsonl \
        runs/synth/annotation_cpu/steps_train.jsonl self_=runs/synth/self_rft_cpu/steps_train.jsonl

A source is `FILE` (datasets unchanged) or `PREFIX=FILE`. Records are copied otherwise unchanged, in source order.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from retrievers.jsonl import iter_jsonl_objects, write_jsonl_atomic


def parse_source(spec: str) -> tuple[str, Path]:
    prefix, sep, path = spec.partition("=")
    return (prefix, Path(path)) if sep else ("", Path(spec))


def mixed(sources: Sequence[str]) -> Iterator[dict]:
    """The records of every source, each `metadata.dataset` prefixed with its source's prefix."""
    for spec in sources:
        prefix, path = parse_source(spec)
        if not path.is_file():
            raise FileNotFoundError(f"step records {path} do not exist (source {spec!r}); write them first")
        for _, row in iter_jsonl_objects(path):
            if prefix:
                meta = row.get("metadata") or {}
                row = {**row, "metadata": {**meta, "dataset": prefix + str(meta.get("dataset", ""))}}
            yield row


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="+", help="FILE or PREFIX=FILE (steps.jsonl written by kbrouter synth)")
    ap.add_argument("--out", required=True, help="the mixed steps JSONL")
    args = ap.parse_args(argv)
    rows = list(mixed(args.sources))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(args.out, rows)
    counts = Counter((r.get("metadata") or {}).get("dataset", "") for r in rows)
    print(f"{len(rows)} records -> {args.out}: {dict(sorted(counts.items()))}")


if __name__ == "__main__":
    main()
