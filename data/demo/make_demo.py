"""Regenerate the demo KB data from ../shared/data (run from the repo root: python data/demo/make_demo.py).

Copies the supporting and distractor paragraphs of 8 HotpotQA questions plus 220 random FlashRAG Wikipedia
passages (seed 0) into passages.jsonl, the first 36 WikiTableQuestions tables (csv + page json) into tables/,
and writes questions.jsonl. See ATTRIBUTION.md for sources and licences.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

HOTPOT = ["75f606a8", "c4f382d2", "82a3e814", "4fd0440f", "e288289e", "5f59863b", "0d9c2089", "32d3a1c0"]
DEMO_TEXT = ["75f606a8", "c4f382d2", "e288289e", "5f59863b"]  # the text questions in questions.jsonl
WTQ_QUESTIONS = ["wtq-nu-485", "wtq-nu-52", "wtq-nu-2201"]
N_TABLES, N_FLASHRAG = 36, 220


def main(argv: list[str] | None = None) -> int:
    shared = Path(argv[0] if argv else "../shared/data")
    out = Path(__file__).resolve().parent
    questions = [json.loads(x) for x in (shared / "text/questions.jsonl").open()]
    chosen = [q for q in questions if q["dataset"] == "hotpotqa" and q["qid"][-8:] in HOTPOT]
    assert len(chosen) == len(HOTPOT), [q["qid"] for q in chosen]
    corpus = {d["doc_id"]: d for d in map(json.loads, (shared / "text/corpus.jsonl").open())}
    ids = list(dict.fromkeys(i for q in chosen for i in q["context_doc_ids"]))
    rows = [{"id": i, "title": corpus[i]["title"], "text": corpus[i]["text"], "source": "hotpotqa"} for i in ids]
    flash = [json.loads(x) for x in (shared / "text/wiki_passages_flashrag_sample1000.jsonl").open()]
    for d in random.Random(0).sample(flash, N_FLASHRAG):
        rows.append({"id": d["doc_id"], "title": d["title"], "text": d["text"], "source": "flashrag"})
    with (out / "passages.jsonl").open("w") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)

    tables_out = out / "tables"
    shutil.rmtree(tables_out, ignore_errors=True)
    tables_out.mkdir()
    csvs = sorted((shared / "table/wtq/tables").glob("*.csv"))[:N_TABLES]
    for p in csvs:
        shutil.copy(p, tables_out / p.name)
        shutil.copy(p.with_suffix(".json"), tables_out / p.with_suffix(".json").name)

    demo = []
    for q in chosen:
        if q["qid"][-8:] in DEMO_TEXT:
            meta = {"source_qid": q["qid"], "supporting_doc_ids": q["supporting_doc_ids"]}
            demo.append(
                {
                    "id": f"demo-{len(demo)}",
                    "question": q["question"],
                    "answers": q["answers"],
                    "kb": "text",
                    "metadata": meta,
                }
            )
    wtq = {q["qid"]: q for q in map(json.loads, (shared / "table/wtq/questions.jsonl").open())}
    for qid in WTQ_QUESTIONS:
        q = wtq[qid]
        assert (tables_out / f"{q['table_id']}.csv").exists(), q["table_id"]
        demo.append(
            {
                "id": f"demo-{len(demo)}",
                "question": q["question"],
                "answers": q["answers"],
                "kb": "table",
                "metadata": {"source_qid": qid, "table_id": q["table_id"]},
            }
        )
    with (out / "questions.jsonl").open("w") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in demo)
    print(f"{len(rows)} passages, {len(csvs)} tables, {len(demo)} questions -> {out}")  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
