"""`kbrouter ingest PATH... --name NAME`: your own files as knowledge bases.

Walks files and folders (PDF, HTML, Markdown, DOCX, XLSX, CSV/TSV, images, videos), writes the text, document,
table, image, clip and video corpora into `--corpus-dir` (default `data/ingest/NAME`) and a KB-set YAML (default
`configs/kb/NAME.yaml`) that `kbrouter index | ask | run | eval` and the servers read as they are:

    kbrouter ingest ../shared/data/docs --name docs --exclude SOURCES.md qa.jsonl
    kbrouter index --kb configs/kb/docs.yaml
    kbrouter ask "How many permit checks were recorded for Kentucky in November 2015?" --kb configs/kb/docs.yaml

A rerun re-parses only files whose content changed and drops the records of deleted files; the index build then
reuses every KB whose corpus did not change. A file that cannot be read (encrypted, corrupt, a scan without text,
over a limit, an unsupported type) is skipped with its reason in the summary, and the run goes on. CPU only; no
model weights are needed to parse.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import Counter
from pathlib import Path

from ingest.corpora import YAML_MARK, kb_yaml, write_corpora, write_if_changed
from ingest.job import PARSER_CHOICES, FileOutcome, Settings, run_ingest
from ingest.units import Limits

SUMMARY_FILE = "summary.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kbrouter ingest", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files and folders to ingest")
    parser.add_argument("--name", required=True, help="name of the KB set (names the corpus folder and YAML)")
    parser.add_argument("--out", help="KB YAML to write (default configs/kb/NAME.yaml)")
    parser.add_argument("--corpus-dir", help="where corpora, figures and indexes go (default data/ingest/NAME)")
    parser.add_argument("--exclude", nargs="+", default=[], metavar="GLOB", help="leave out matching files")
    parser.add_argument("--password", default="", help="password tried on encrypted PDFs (never stored)")
    parser.add_argument("--max-mb", type=float, default=200, help="skip files larger than this (MiB)")
    parser.add_argument("--max-pages", type=int, default=2000, help="skip PDFs with more pages")
    parser.add_argument("--max-seconds", type=float, default=300, help="skip a file whose parse takes longer")
    parser.add_argument("--max-rows", type=int, default=100_000, help="skip a CSV/TSV/sheet with more rows")
    parser.add_argument(
        "--table-rows", type=int, default=25, help="most rows per table record (fewer when rows are wide)"
    )
    parser.add_argument("--encoder", default="minilm", help="text encoder of the KBs (`minilm` or a model path)")
    parser.add_argument("--clip-model", default="kbrouter-tiny-clip", help="open_clip model of the media KBs")
    parser.add_argument("--clip-pretrained", default=None, help="open_clip weights tag or checkpoint path")
    parser.add_argument(
        "--parser", choices=PARSER_CHOICES, default="builtin",
        help="builtin: the weight-free readers; docling: DOCX/HTML (PDF with layout weights) read by docling in "
        "its own env (`make docling`), other formats builtin",
    )  # fmt: skip
    parser.add_argument("--force", action="store_true", help="re-parse everything (also: settings changed)")
    parser.add_argument("--quiet", action="store_true", help="print the summary only")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Ingest the paths, write corpora and the KB YAML, print the summary; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    if args.table_rows < 1:
        raise ValueError(f"--table-rows must be >= 1, got {args.table_rows}")
    limits = Limits(
        max_bytes=int(args.max_mb * 2**20), max_pages=args.max_pages, max_seconds=args.max_seconds,
        max_rows=args.max_rows,
    )  # fmt: skip
    settings = Settings(limits=limits, password=bool(args.password), exclude=tuple(args.exclude), parser=args.parser)
    corpus_dir = Path(args.corpus_dir or Path("data") / "ingest" / args.name)
    yaml_path = Path(args.out or Path("configs") / "kb" / f"{args.name}.yaml")
    if yaml_path.is_file() and not args.force and YAML_MARK not in yaml_path.read_text(encoding="utf-8")[:400]:
        raise ValueError(f"{yaml_path} exists and was not written by kbrouter ingest; choose --out or add --force")

    def show(o: FileOutcome) -> None:
        if args.quiet:
            return
        if o.status == "skipped":
            print(f"  skipped  {o.file}: {o.reason} ({o.message})")
        else:
            p = o.parsed
            assert p is not None
            what = f"{p.pages} pages, " if p.pages else ""
            print(
                f"  {o.status:<8} {o.file}: {what}{len(p.passages)} passages, {len(p.tables)} tables, "
                f"{len(p.figures)} figures{f', {len(p.videos)} videos' if p.videos else ''}"
                + (f"  ({o.seconds:.2f} s)" if o.status == "parsed" else "")
            )

    start = time.perf_counter()
    outcomes, removed = run_ingest(args.paths, corpus_dir, settings, args.password, args.force, on_file=show)
    parses = [o.parsed for o in outcomes if o.parsed is not None]
    counts = write_corpora(parses, corpus_dir, args.table_rows)
    options = {"encoder": args.encoder, "clip_model": args.clip_model, "clip_pretrained": args.clip_pretrained}
    if args.clip_pretrained:
        options["visual_weight"] = 0.8
    yaml_path.parent.mkdir(parents=True, exist_ok=True)
    if any(counts.values()):
        write_if_changed(yaml_path, kb_yaml(args.name, corpus_dir, yaml_path, counts, options))
    summary = summarize(outcomes, removed, counts, time.perf_counter() - start)
    (corpus_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    print_summary(summary, yaml_path if any(counts.values()) else None)
    return 0 if any(counts.values()) else 1


def summarize(outcomes: list[FileOutcome], removed: list[str], counts: dict[str, int], seconds: float) -> dict:
    """Counts of files, pages and records, skips by reason, and the parse speed of this run."""
    parsed = [o for o in outcomes if o.status == "parsed" and o.parsed is not None]
    kept = [o.parsed for o in outcomes if o.parsed is not None]
    parse_s = sum(o.seconds for o in parsed)
    paged = [o for o in parsed if o.parsed is not None and o.parsed.pages]  # pages/s: over the paged files alone
    pages_parsed, paged_s = sum(o.parsed.pages for o in paged), sum(o.seconds for o in paged)
    skips = Counter(o.reason for o in outcomes if o.status == "skipped")
    return {
        "files": len(outcomes),
        "parsed": len(parsed),
        "reused": sum(o.status == "reused" for o in outcomes),
        "skipped": sum(skips.values()),
        "removed": removed,
        "pages": sum(p.pages for p in kept),
        "passages": counts.get("passages", 0),
        "documents": counts.get("documents", 0),
        "tables": sum(len(p.tables) for p in kept),
        "table_records": counts.get("tables", 0),
        "figures": counts.get("images", 0),
        "videos": counts.get("videos", 0),
        "skips_by_reason": dict(sorted(skips.items())),
        "skipped_files": {o.file: f"{o.reason}: {o.message}" for o in outcomes if o.status == "skipped"},
        "seconds": round(seconds, 2),
        "parse_seconds": round(parse_s, 2),
        "pages_per_second": round(pages_parsed / paged_s, 2) if paged_s > 0 else None,
    }


def print_summary(s: dict, yaml_path: Path | None) -> None:
    print(
        f"files {s['files']} (parsed {s['parsed']}, reused {s['reused']}, skipped {s['skipped']}, removed "
        f"{len(s['removed'])}) | pages {s['pages']} | passages {s['passages']} | documents {s['documents']} | "
        f"tables {s['tables']} ({s['table_records']} records) | figures {s['figures']} | videos {s['videos']}"
    )
    if s["skips_by_reason"]:
        print("skips by reason: " + ", ".join(f"{r} {n}" for r, n in s["skips_by_reason"].items()))
    speed = f", {s['pages_per_second']} pages/s" if s["pages_per_second"] else ""
    print(f"time {s['seconds']} s (parsing {s['parse_seconds']} s{speed})")
    if yaml_path is None:
        print("nothing to index: no file gave any record")
    else:
        print(f"KB set: {yaml_path}   next: kbrouter index --kb {yaml_path}")


if __name__ == "__main__":
    raise SystemExit(main())
