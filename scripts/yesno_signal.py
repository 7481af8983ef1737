"""Does a reader's yes/no answer carry information, or only a prior? Its yes-vs-no margin, ranked against the gold.

    python scripts/yesno_signal.py outputs/eval/validation_cpu --method agent_grpo
    python scripts/yesno_signal.py outputs/eval/scoreboard_cpu --method agent_base_constrained --model smollm2

For every yes/no question (`metadata.answer_type`) the method answered after a search, the answer step is rebuilt
exactly as the agent rendered it (`metadata.render`: few-shot, evidence length), its recorded think is kept, and the
model is read once at the first token of `<answer>`: margin = log P(yes) - log P(no), each summed over "yes"/"Yes".
Per dataset it prints:
- AUC of the margin against the gold (0.5: the margin orders yes and no questions no better than chance, so no
  threshold and no calibration can make the answers better than a constant), with a bootstrap s.e.;
- `said acc`: the accuracy of what the method answered;
- `median acc`: the accuracy when the median margin splits the answers half yes, half no (a calibration that needs
  no labels, in the spirit of contextual calibration);
- the share of "yes" among the golds and among the answers.
The margins are the model's own, so pass the policy the method ran with (`--model`, `--adapter`, `--dtype`).
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.metrics import normalize_answer  # noqa: E402
from agent.protocol import tags  # noqa: E402
from retrievers.jsonl import read_jsonl  # noqa: E402

WORDS = ("yes", "no")


def auc(margins: Sequence[float], golds: Sequence[str]) -> float | None:
    """Area under the ROC curve of `margins` for gold "yes" against gold "no"; None unless both occur."""
    if len(set(golds)) < 2:
        return None
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score([g == "yes" for g in golds], margins))


def bootstrap_se(margins: Sequence[float], golds: Sequence[str], resamples: int = 1000, seed: int = 0) -> float:
    rng = random.Random(seed)
    idx = range(len(margins))
    boot = []
    for _ in range(resamples):
        pick = rng.choices(idx, k=len(margins))
        value = auc([margins[i] for i in pick], [golds[i] for i in pick])
        if value is not None:
            boot.append(value)
    return statistics.pstdev(boot) if len(boot) > 1 else float("nan")


def median_split_accuracy(margins: Sequence[float], golds: Sequence[str]) -> float:
    """Accuracy when the answers above the median margin say yes and the rest no (labels unused)."""
    cut = statistics.median(margins)
    return statistics.fmean((m > cut) == (g == "yes") for m, g in zip(margins, golds, strict=True))


def answer_prefix(raw: str) -> str | None:
    """The completion up to and including its answer open tag (the think the model wrote stays); None without one."""
    match = re.search(rf"<\s*{re.escape(tags.ANSWER)}\s*>", raw, re.IGNORECASE)
    return raw[: match.end()] if match else None


def yesno_rows(rows: list[dict], method: str) -> list[dict]:
    """The method's yes/no questions whose first searched step has an answer completion to read."""
    out = []
    for row in rows:
        traj = row.get("trajectory") or {}
        meta = traj.get("metadata") or {}
        gold = normalize_answer((traj.get("gold") or [""])[0])
        if row.get("method") != method or meta.get("answer_type") != "yesno" or gold not in WORDS:
            continue
        step = next((s for s in traj.get("steps", []) if s.get("kb")), None)
        prefixes = [p for p in (answer_prefix(r) for r in (step or {}).get("raw", [])[1:]) if p]
        if prefixes:
            out.append({"row": row, "step": step, "prefix": prefixes[-1], "gold": gold})
    return out


def margins_for(policy, items: list[dict]) -> list[float]:  # noqa: ANN001 - a TransformersPolicy
    import torch

    from agent.protocol.prompts import PromptSettings, answer_messages
    from retrievers.types import Hit

    tok = policy.tokenizer
    ids = {w: [tok.encode(v, add_special_tokens=False)[0] for v in (w, w.capitalize())] for w in WORDS}
    out = []
    for item in items:
        render = item["row"]["trajectory"]["metadata"].get("render") or {}
        settings = PromptSettings(
            few_shot=bool(render.get("few_shot", False)),
            evidence_chars=int(render.get("evidence_chars", PromptSettings().evidence_chars)),
            evidence_focus=str(render.get("evidence_focus", PromptSettings().evidence_focus)),
        )
        hits = [Hit.from_dict(h) for h in item["step"].get("hits", [])]
        text = policy.render(answer_messages(item["step"]["sub_question"], hits, settings=settings)) + item["prefix"]
        enc = tok(text, return_tensors="pt", add_special_tokens=False).to(policy.device)
        with torch.no_grad():
            logp = torch.log_softmax(policy.model(**enc).logits[0, -1].float(), dim=-1)
        yes, no = (torch.logsumexp(logp[ids[w]], dim=0).item() for w in WORDS)
        out.append(yes - no)
    return out


def summarize(items: list[dict], margins: list[float]) -> list[dict]:
    by_ds: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        by_ds.setdefault(item["row"]["dataset"], []).append(i)
    table = []
    for name, idx in [*sorted(by_ds.items()), ("all", list(range(len(items))))]:
        m = [margins[i] for i in idx]
        g = [items[i]["gold"] for i in idx]
        said = [normalize_answer(items[i]["row"]["trajectory"].get("final_answer") or "") for i in idx]
        table.append(
            {
                "dataset": name,
                "n": len(idx),
                "auc": auc(m, g),
                "auc_se": bootstrap_se(m, g),
                "said_acc": statistics.fmean(s == x for s, x in zip(said, g, strict=True)),
                "median_acc": median_split_accuracy(m, g),
                "gold_yes": statistics.fmean(x == "yes" for x in g),
                "said_yes": statistics.fmean(s == "yes" for s in said),
            }
        )
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "predictions",
        help="a `kbrouter eval` output folder or its predictions.jsonl (the last run's methods); its cache.jsonl "
        "holds every method the folder ever ran (the last record of a question wins)",
    )
    ap.add_argument("--method", required=True, help="the method whose yes/no answers are read")
    ap.add_argument("--model", default="smollm2-kbrouter", help="the policy that method ran (default: the router)")
    ap.add_argument("--adapter", default=None)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    path = Path(args.predictions)
    path = path / "predictions.jsonl" if path.is_dir() else path
    if not path.is_file():
        ap.error(f"{path} does not exist: pass a `kbrouter eval` output folder or its predictions.jsonl")
    latest = {(r.get("method"), r.get("qid")): r for r in read_jsonl(path)}  # a cache can hold a question twice
    items = yesno_rows(list(latest.values()), args.method)
    if not items:
        ap.error(f"no yes/no question of method {args.method!r} with an answer step in {path}")
    from agent.backends.hf import TransformersPolicy

    policy = TransformersPolicy(args.model, adapter=args.adapter, dtype=args.dtype)
    table = summarize(items, margins_for(policy, items))
    print(f"{args.method} ({policy.name}, {args.dtype}) in {path}: margin = log P(yes) - log P(no) at <answer>")
    print(f"{'dataset':<10} {'n':>4} {'AUC':>13} {'said acc':>9} {'median acc':>11} {'gold yes':>9} {'said yes':>9}")
    for r in table:
        auc_text = "-" if r["auc"] is None else f"{r['auc']:.3f} ± {r['auc_se']:.3f}"
        print(
            f"{r['dataset']:<10} {r['n']:>4} {auc_text:>13} {r['said_acc']:>9.3f} {r['median_acc']:>11.3f} "
            f"{r['gold_yes']:>9.3f} {r['said_yes']:>9.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
