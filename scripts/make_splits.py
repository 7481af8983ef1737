"""Write `data/splits/shared_heldout.json`: which questions of ../shared/data are held out for evaluation.

Training (synthesis) never reads a held-out question, and the scoreboard reads only held-out ones. The rule is
deterministic, so the file can be rebuilt and checked:
- HotpotQA: the `dev` split is held out, `train` is for training.
- MuSiQue ships only train questions: a question is held out when sha1(qid) % 3 == 0 (about a third).
- TabFact, WTQ: split by table (sha1(table_id) % 2 == 0 held out), so no held-out table is seen in training.
- COCO: split by image the same way.
- Video: all 15 questions are held out (the scoreboard scores every one); none is used for training.

Run: python scripts/make_splits.py [--shared ../shared/data]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def bucket(key: str, n: int) -> int:
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % n


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--out", default=str(REPO / "data" / "splits" / "shared_heldout.json"))
    args = ap.parse_args()
    shared = Path(args.shared)
    text = rows(shared / "text" / "questions.jsonl")
    held: dict[str, dict] = {}
    held["hotpotqa"] = {"qids": sorted(r["qid"] for r in text if r["dataset"] == "hotpotqa" and r["split"] == "dev")}
    held["musique"] = {
        "qids": sorted(r["qid"] for r in text if r["dataset"] == "musique" and bucket(r["qid"], 3) == 0)
    }
    tabfact = rows(shared / "table" / "tabfact" / "statements.jsonl")
    tf_tables = sorted({r["table_id"] for r in tabfact if bucket(r["table_id"], 2) == 0})
    held["tabfact"] = {
        "tables": tf_tables,
        "qids": sorted(r["qid"] for r in tabfact if r["table_id"] in set(tf_tables)),
    }
    wtq = rows(shared / "table" / "wtq" / "questions.jsonl")
    wtq_tables = sorted({r["table_id"] for r in wtq if bucket(r["table_id"], 2) == 0})
    held["wtq"] = {"tables": wtq_tables, "qids": sorted(r["qid"] for r in wtq if r["table_id"] in set(wtq_tables))}
    coco = rows(shared / "image" / "coco" / "qa_derived.jsonl")
    images = sorted({r["image_id"] for r in coco if bucket(r["image_id"], 2) == 0})
    held["coco"] = {"images": images, "qids": sorted(r["qid"] for r in coco if r["image_id"] in set(images))}
    video = rows(shared / "video" / "qa.jsonl")
    held["video"] = {"qids": sorted(r["qid"] for r in video)}
    out = {
        "rule": __doc__.split("deterministic, so the file can be rebuilt and checked:\n")[1].split("\nRun:")[0],
        "heldout": held,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for name, h in held.items():
        print(
            f"{name:9s} held out: {len(h['qids'])} questions"
            + "".join(f", {len(v)} {k}" for k, v in h.items() if k != "qids")
        )


if __name__ == "__main__":
    main()
