"""Build the indexes of the knowledge bases declared in a KB YAML file (`kbrouter index`).

Usage (CPU is fine; dense encoding uses a GPU when one is visible):

    python -m retrievers.build --kb configs/kb/demo.yaml
    python -m retrievers.build --kb configs/kb/shared_text.yaml --only hotpot_wiki --force
    kbrouter index --kb configs/kb/shared_text.yaml --workers 2     # two encoder processes (one per GPU if any)

An index that is up to date (same encoder, settings and corpus bytes) and intact (its files' sizes, sampled hashes
and document counts match its manifest) is reused, not rebuilt; a corrupt one is rebuilt. `--verify` hashes every
index file whole before reusing it. An interrupted build (Ctrl-C, a killed process) resumes from its last
encoded chunk on the next run.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time

from retrievers.config import load_kb_configs, select_kbs
from retrievers.kb import build_kb_status


def main(argv: list[str] | None = None) -> int:
    """Build (or reuse) KB indexes and print a summary table; returns the exit code."""
    parser = argparse.ArgumentParser(prog="kbrouter index", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", required=True, help="KB YAML file (knowledge_bases: [...])")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="build only these KBs (by name)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the index is up to date")
    parser.add_argument(
        "--verify", action="store_true", help="hash every index file whole (slow on large indexes); rebuild if corrupt"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars, warnings only")
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="encoder processes for text/table KBs (sentence-transformers' pool; one per GPU when there are GPUs); "
        "overrides `encode_workers` in the YAML",
    )
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(message)s")

    configs = load_kb_configs(args.kb)
    try:
        configs = select_kbs(configs, args.only, args.kb)
    except ValueError as e:
        parser.error(f"--only: {e}")
    if args.workers is not None:
        configs = [dataclasses.replace(c, encode_workers=args.workers) for c in configs]

    rows = []
    for cfg in configs:
        start = time.perf_counter()
        try:
            index_dir, manifest, reused = build_kb_status(
                cfg, force=args.force, progress=not args.quiet, verify=args.verify
            )
        except KeyboardInterrupt as e:  # Ctrl-C: `kbrouter` prints what was kept
            e.args = (
                f"{len(rows)} of {len(configs)} KB indexes ready; {cfg.name}'s unfinished build is never used "
                "(an index is swapped in only when complete); run the same command again to resume it",
            )
            raise
        status = ("reused (verified)" if args.verify else "reused (up to date)") if reused else "built"
        rows.append(
            (
                cfg.name,
                str(manifest["doc_count"]),
                str(manifest["dim"] or "-"),
                f"{time.perf_counter() - start:.1f}",
                status,
                str(index_dir),
            )
        )

    header = ("KB", "docs", "dim", "seconds", "status", "index dir")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())  # noqa: T201 (CLI output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
