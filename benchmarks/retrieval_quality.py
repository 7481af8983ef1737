"""Retrieval quality of BM25, dense MiniLM and hybrid (RRF) on the shared text and table data.

- text: 525 multi-hop questions (HotpotQA, MuSiQue) over 5,812 Wikipedia paragraphs; recall@2/5/10 is the
  fraction of a question's supporting paragraphs found in its top k passages, averaged over questions.
- table: TabFact statements -> the table they are about, among 1,000 tables; a seeded sample of statements;
  recall@1/5 is the fraction whose table is in the top k.

- eval questions (`--predictions`): the sub-questions a method of a `kbrouter eval` run sent to one KB of a KB file
  (`--kb-config`, `--kb`), against the gold paragraphs of each question whose gold KB it is: recall@1/3/5, the
  recall@3 being what the agent reads at `top_k: 3`. The index is that KB's own when it searches hybrid; else a
  hybrid copy is built in the cache folder.

Indexes are built once (hybrid, flat, all-MiniLM-L6-v2) into the cache folder and reused on later runs. The
dense and BM25 lists are taken `--depth` deep once, and every hybrid setting fuses prefixes of those same lists
with `reciprocal_rank_fusion`, exactly as `search` does. Run on CPU (about 10-20 min the first time on 2 cores):

    python benchmarks/retrieval_quality.py
    python benchmarks/retrieval_quality.py --only table --statements 500 --seed 1
    python benchmarks/retrieval_quality.py --predictions outputs/eval/scoreboard_cpu --method agent_grpo \
        --kb-config configs/kb/eval_cpu.yaml --kb wiki
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HYBRID_SWEEP = [(60, 10), (60, 20), (60, 50), (60, 100), (10, 50), (100, 50)]  # (rrf_k, fusion depth)


def recall(ranked: list[list[str]], gold: list[set[str]], k: int) -> float:
    """Mean over queries of |gold ∩ top-k| / |gold| (top-k ids may repeat: chunks of one paragraph)."""
    return sum(len(g & set(r[:k])) / len(g) for r, g in zip(ranked, gold, strict=True)) / len(gold)


def run(cfg, queries: list[str], gold: list[set[str]], ks: list[int], depth: int, unit_id) -> list[tuple]:
    """Recall rows for BM25, dense, the default hybrid search, and hybrid settings fused from the same lists."""
    from retrievers.fusion import reciprocal_rank_fusion
    from retrievers.kb import build_kb_status, load_kb

    start = time.perf_counter()
    _, manifest, reused = build_kb_status(cfg, progress=True)
    print(f"[{cfg.name}] index {'reused' if reused else 'built'}: {manifest['doc_count']} units "
          f"({manifest['embedded_texts']} embedded texts) in {time.perf_counter() - start:.0f}s")  # fmt: skip
    lists, timing = {}, {}
    for search in ("bm25", "dense", "hybrid"):
        kb = load_kb(dataclasses.replace(cfg, search=search))
        start = time.perf_counter()
        lists[search] = kb.search(queries, k=depth if search != "hybrid" else max(ks))
        timing[search] = (time.perf_counter() - start) / len(queries) * 1000
    ids = {name: [[unit_id(h) for h in hits] for hits in hit_lists] for name, hit_lists in lists.items()}
    rows = [(name, f"{timing[name]:.1f}", *(recall(ids[name], gold, k) for k in ks)) for name in ("bm25", "dense")]
    rows.append((f"hybrid (search: rrf_k={cfg.rrf_k}, depth={cfg.fusion_depth})", f"{timing['hybrid']:.1f}",
                 *(recall(ids["hybrid"], gold, k) for k in ks)))  # fmt: skip
    for rrf_k, d in HYBRID_SWEEP:
        fused = [reciprocal_rank_fusion([dn[:d], bm[:d]], k=rrf_k) for dn, bm in zip(lists["dense"], lists["bm25"],
                                                                                     strict=True)]  # fmt: skip
        fused_ids = [[unit_id(h) for h in hits] for hits in fused]
        if (rrf_k, d) == (cfg.rrf_k, cfg.fusion_depth):  # the offline fusion should reproduce `search`
            same = sum(f[: max(ks)] == h for f, h in zip(fused_ids, ids["hybrid"], strict=True))
            print(f"[{cfg.name}] offline RRF equals search() top-{max(ks)} for {same}/{len(queries)} queries "
                  "(others differ only by the order of tied scores at the depth cut)")  # fmt: skip
        rows.append((f"  rrf_k={rrf_k}, depth={d}", "", *(recall(fused_ids, gold, k) for k in ks)))
    return rows


def print_table(title: str, ks: list[int], rows: list[tuple]) -> None:
    """Print recall rows as an aligned table."""
    header = ("ranker", "ms/query", *(f"recall@{k}" for k in ks))
    cells = [header] + [(r[0], r[1], *(f"{v:.3f}" for v in r[2:])) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, c in enumerate(cells):
        print("  ".join(x.ljust(w) if j == 0 else x.rjust(w) for j, (x, w) in enumerate(zip(c, widths, strict=True))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    """Build or reuse the indexes, run all rankers and print the recall tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shared", type=Path, default=Path(os.environ.get("KBROUTER_SHARED_DATA", ROOT.parent / "shared" / "data"))
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="index folder (default $KBROUTER_CACHE/bench)")
    parser.add_argument("--only", choices=["text", "table"], help="run one half only")
    parser.add_argument("--statements", type=int, default=1000, help="TabFact statements sampled")
    parser.add_argument("--seed", type=int, default=0, help="seed of the statement sample")
    parser.add_argument("--depth", type=int, default=100, help="candidates taken from each ranker")
    parser.add_argument("--predictions", type=Path, help="a `kbrouter eval` output folder or predictions file")
    parser.add_argument("--method", default="agent_grpo", help="with --predictions: whose sub-questions")
    parser.add_argument("--kb-config", type=Path, help="with --predictions: the KB file the eval ran on")
    parser.add_argument("--kb", default="wiki", help="with --predictions: the KB (by name) to measure")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from retrievers.config import KBConfig, default_cache_dir

    if args.predictions is not None:
        return eval_questions(parser, args)
    cache = args.cache_dir or default_cache_dir() / "bench"
    data = args.shared
    if not (data / "text" / "corpus.jsonl").exists():
        parser.error(f"shared data not found under {data}; pass --shared DIR")

    if args.only in (None, "text"):
        questions = [json.loads(x) for x in (data / "text" / "questions.jsonl").open()]
        cfg = KBConfig(name="bench_text", kind="text", corpus=data / "text" / "corpus.jsonl",
                       search="hybrid", index_dir=cache / "text")  # fmt: skip
        ks = [2, 5, 10]
        rows = run(cfg, [q["question"] for q in questions], [set(q["supporting_doc_ids"]) for q in questions], ks,
                   args.depth, unit_id=lambda h: h.doc.metadata["doc_id"])  # fmt: skip
        print_table(f"TEXT: {len(questions)} questions, 5,812 paragraphs (passages <=100 words, title prepended); "
                    "recall of supporting paragraphs", ks, rows)  # fmt: skip

    if args.only in (None, "table"):
        tabfact = data / "table" / "tabfact"
        statements = [json.loads(x) for x in (tabfact / "statements.jsonl").open()]
        sample = random.Random(args.seed).sample(statements, min(args.statements, len(statements)))
        cfg = KBConfig(name="bench_tabfact", kind="table", corpus=tabfact / "tables", search="hybrid",
                       options={"metadata_file": str(tabfact / "statements.jsonl")}, index_dir=cache / "tabfact")  # fmt: skip
        ks = [1, 5]
        rows = run(cfg, [s["statement"] for s in sample], [{s["table_id"]} for s in sample], ks, args.depth,
                   unit_id=lambda h: h.doc.id)  # fmt: skip
        print_table(f"TABLE: {len(sample)} TabFact statements (random.Random({args.seed}).sample of "
                    f"{len(statements):,}) -> their table among 1,000 (caption + page title + rows)", ks, rows)  # fmt: skip
    return 0


def eval_questions(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Recall of one KB on the sub-questions an eval method sent it (first search; the question if none)."""
    from retrievers.config import load_kb_configs
    from retrievers.jsonl import read_jsonl

    if args.kb_config is None:
        parser.error("--predictions needs --kb-config: the KB file the eval ran on")
    path = args.predictions / "predictions.jsonl" if args.predictions.is_dir() else args.predictions
    if not path.is_file():
        parser.error(f"{path} does not exist: pass a `kbrouter eval` output folder or its predictions.jsonl")
    cfgs = {c.name: c for c in load_kb_configs(args.kb_config)}
    if args.kb not in cfgs:
        parser.error(f"KB {args.kb!r} is not in {args.kb_config} (it has {', '.join(cfgs)})")
    queries, gold = [], []
    for row in read_jsonl(path):
        meta = (row.get("trajectory") or {}).get("metadata") or {}
        if row.get("method") != args.method or meta.get("gold_kb") != args.kb or not meta.get("gold_evidence"):
            continue
        searched = next((s for s in row["trajectory"].get("steps") or [] if s.get("kb")), None)
        queries.append((searched or {}).get("sub_question") or row["question"])
        gold.append(set(meta["gold_evidence"]))
    if not queries:
        parser.error(f"no question of method {args.method!r} with gold KB {args.kb!r} and gold evidence in {path}")
    cfg = cfgs[args.kb]
    if cfg.search != "hybrid":  # a hybrid index holds the BM25 and dense ones; never rebuild the KB's own as one
        from retrievers.config import default_cache_dir

        index_dir = (args.cache_dir or default_cache_dir() / "bench") / f"eval_{cfg.name}"
        cfg = dataclasses.replace(cfg, search="hybrid", index_dir=index_dir)
    ks = [1, 3, 5]
    rows = run(cfg, queries, gold, ks, args.depth, unit_id=lambda h: h.doc.metadata.get("doc_id", h.doc.id))
    print_table(f"{args.kb.upper()}: {len(queries)} sub-questions of {args.method} in {path}; recall of the gold "
                "evidence", ks, rows)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
