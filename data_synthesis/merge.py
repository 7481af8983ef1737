"""Join the shards of a synthesis job (`output_dir/shards/IIIII-of-NNNNN/`) into `output_dir`.

Each output file holds the committed records of the shards' files in shard order, written under a temporary name and
renamed. A shard whose batches are not all committed stops the merge (name it with `--allow-partial` to merge what
is there), as do trajectory ids seen twice. The summary and the `datasets` export are rebuilt from the merged files.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from data_synthesis.commit_log import MANIFEST, OUTPUTS, PROGRESS, SKIPPED, committed_rows, read_progress
from data_synthesis.summary import finalize
from retrievers.jsonl import read_jsonl, write_jsonl_atomic

logger = logging.getLogger(__name__)

_SHARD = re.compile(r"^(\d+)-of-(\d+)$")


def find_shards(output_dir: Path) -> list[Path]:
    """Shard folders in shard order; all must come from one `num_shards`."""
    root = Path(output_dir) / "shards"
    found = sorted((int(m[1]), int(m[2]), p) for p in root.glob("*-of-*") if (m := _SHARD.match(p.name)))
    if not found:
        raise FileNotFoundError(f"no shard folders under {root}; run `kbrouter synth ... --shard i --num-shards N`")
    totals = {n for _, n, _ in found}
    if len(totals) != 1:
        raise ValueError(f"{root} mixes shard counts {sorted(totals)}; keep one run per output_dir")
    total = totals.pop()
    missing = sorted(set(range(total)) - {i for i, _, _ in found})
    if missing:
        raise ValueError(f"shards {missing} of {total} are missing under {root}; run them before merging")
    return [p for _, _, p in found]


def merge_shards(output_dir: str | Path, allow_partial: bool = False, export_format: str = "parquet") -> dict:
    """Merge all shards of `output_dir` into it; returns the merged summary.

    Raises:
        ValueError: a shard is unfinished (unless `allow_partial`), or a trajectory id appears in two shards.
    """
    output_dir = Path(output_dir)
    shards = find_shards(output_dir)
    hashes, ms, progress = set(), set(), []
    for shard in shards:
        manifest = json.loads((shard / MANIFEST).read_text())
        hashes.add(manifest["config_hash"])
        ms.add(manifest["m"])
        lines = read_progress(shard)
        if len(lines) < manifest["batches"] and not allow_partial:
            raise ValueError(f"shard {shard.name} committed {len(lines)} of {manifest['batches']} batches; resume it "
                             "(same command) or pass --allow-partial")  # fmt: skip
        progress += lines
    if len(hashes) != 1:
        raise ValueError(f"shards of {output_dir} were made by different recipes (hashes {sorted(hashes)})")
    seen: set[str] = set()
    for name in OUTPUTS[:2]:
        for shard in shards:
            for row in committed_rows(shard, name, read_progress(shard)):
                if row["id"] in seen:
                    raise ValueError(f"trajectory {row['id']!r} appears twice (again in shard {shard.name})")
                seen.add(row["id"])
    for name in OUTPUTS:
        write_jsonl_atomic(
            output_dir / name, (row for s in shards for row in committed_rows(s, name, read_progress(s)))
        )
    write_jsonl_atomic(
        output_dir / SKIPPED, (row for s in shards if (s / SKIPPED).exists() for row in read_jsonl(s / SKIPPED))
    )
    write_jsonl_atomic(output_dir / PROGRESS, progress)
    logger.info("merged %d shards into %s", len(shards), output_dir)
    return finalize(output_dir, ms.pop(), export_format=export_format)
