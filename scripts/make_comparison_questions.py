"""Templated yes/no comparison questions over the text KB's training passages (routing data for the Text Retriever).

Stage 2c sends 13 of 60 held-out HotpotQA questions of the validation part to the TabFact tables, and 12 of them are
yes/no comparisons ("Are Daryl Hall and Gerry Marsden both musicians?"): the only yes/no questions it trained on in
number are TabFact's ("Is it true that ...?", 242 accepted), against 13 HotpotQA comparisons. This script writes more
of the second kind from the text corpus itself, in the shared text format the annotation teacher reads
(`type: comparison`, two supporting paragraphs, `supporting_facts` on their first sentences):
- "Are <A> and <B> both <category>?" -> yes when both first sentences name the same category, else no;
- "Which one is a <category>, <A> or <B>?" -> the one whose first sentence names it.
A paragraph's category is the head noun of its first sentence's "<title> is a <...> <noun>" ("Local H is an American
rock band from Zion" -> band). Only paragraphs of the training sources are read (HotpotQA train and MuSiQue train);
no HotpotQA dev paragraph, so no scored question's support, is used. The teacher then retrieves each hop's evidence as
it does for HotpotQA's own comparisons and keeps a trajectory only when both paragraphs are found.
Stop 34's plan adapter kept only their plan steps (`scripts/split_steps.py --plan-only text_comparisons`); stop 35's
recipe (`configs/train/smollm2_router_sft_compare_lora_cpu.yaml`) trains their whole trajectories, answers included,
so a final yes/no is only as good as the category heuristic.

Run: python scripts/make_comparison_questions.py --corpus ../shared/data/text/corpus.jsonl \
         --out data/synth/text_comparison_questions.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import defaultdict
from pathlib import Path

TRAIN_SOURCES = ("hotpotqa_train_distractor", "musique_ans_train")
# "<subject> is / was a(n) <modifiers> <noun>" up to the first word that starts a complement
DEFINITION = re.compile(
    r"\b(?:is|was)\s+(?:an?|the)\s+((?:[\w-]+\s+){0,5}?[a-z][\w-]*)"
    r"(?=\s+(?:of|in|from|by|that|which|who|for|on|at|based|located|and|with|founded|born|written|directed|"
    r"produced|released|published|known|created|formed|situated|starring)\b|\s*[,.;(])"
)
NOT_CATEGORIES = {"member", "part", "number", "type", "kind", "series", "one", "name", "form", "former", "term"}


def category(text: str) -> str | None:
    """The head noun of the first sentence's definition, or None when it has none."""
    first = text.split(". ")[0]
    m = DEFINITION.search(first)
    if not m:
        return None
    noun = m.group(1).split()[-1].lower()
    return noun if noun.isalpha() and len(noun) > 2 and noun not in NOT_CATEGORIES else None


def plural(noun: str) -> str:
    if noun.endswith("man"):
        return noun[:-3] + "men"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + ("es" if noun.endswith(("s", "sh", "ch", "x")) else "s")


def bare_title(title: str) -> str:
    return re.sub(r"\s*\([^)]*\)\s*$", "", title).strip()


def comparison_rows(passages: list[dict], n: int, seed: int) -> list[dict]:
    """`n` questions, half "both" (half of them yes) and half "which one", over pairs of distinct titles."""
    rng = random.Random(seed)
    by_cat: dict[str, list[dict]] = defaultdict(list)
    for p in passages:
        if (cat := category(p["text"])) and bare_title(p["title"]):
            by_cat[cat].append(p)
    shared = [c for c, ps in by_cat.items() if len(ps) >= 2]
    cats = sorted(by_cat)
    rows, seen = [], set()

    def add(a: dict, b: dict, question: str, answer: str, kind: str) -> None:
        key = (a["doc_id"], b["doc_id"], kind)
        if key in seen or bare_title(a["title"]) == bare_title(b["title"]):
            return
        seen.add(key)
        rows.append({"qid": f"textcmp-{len(rows)}", "dataset": "text_comparisons", "split": "train",
                     "question": question, "answers": [answer], "supporting_doc_ids": [a["doc_id"], b["doc_id"]],
                     "hops": 2, "type": "comparison", "supporting_facts": [[a["title"], 0], [b["title"], 0]],
                     "annotation": "templated from the first sentences of two training paragraphs "
                                   "(scripts/make_comparison_questions.py)"})  # fmt: skip

    for _ in range(20 * n):
        if len(rows) >= n:
            break
        kind = rng.choice(("both_yes", "both_no", "which"))
        if kind == "both_yes" and shared:
            a, b = rng.sample(by_cat[rng.choice(shared)], 2)
        else:
            ca, cb = rng.sample(cats, 2)
            a, b = rng.choice(by_cat[ca]), rng.choice(by_cat[cb])
        ta, tb = bare_title(a["title"]), bare_title(b["title"])
        cat_a = category(a["text"])
        if kind == "which":
            first, second = (ta, tb) if rng.random() < 0.5 else (tb, ta)
            add(a, b, f"Which one is a {cat_a}, {first} or {second}?", ta, kind)
        else:
            verb = "Were" if " was " in a["text"].split(". ")[0] else "Are"
            add(a, b, f"{verb} {ta} and {tb} both {plural(cat_a)}?", "yes" if kind == "both_yes" else "no", kind)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=Path("../shared/data/text/corpus.jsonl"))
    ap.add_argument("--out", type=Path, default=Path("data/synth/text_comparison_questions.jsonl"))
    ap.add_argument("-n", type=int, default=240, help="questions to write")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    passages = []
    with args.corpus.open() as f:
        for line in f:
            p = json.loads(line)
            if str(p.get("source", "")).startswith(TRAIN_SOURCES):
                passages.append(p)
    rows = comparison_rows(passages, args.n, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(json.dumps({"training_passages": len(passages), "questions": len(rows), "out": str(args.out)}))


if __name__ == "__main__":
    main()
