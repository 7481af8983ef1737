"""Gold plans: the steps a dataset's own supervision says a question needs (for the annotation teacher).

A `GoldPlan` is the list of retrieval steps (`GoldStep`: sub-question, KB, intermediate answer, gold support) and the
final answer. `PLANNERS` holds one function per source kind; each turns a question (with its source `fields`) into a
plan, or into a skip reason when the row lacks what it needs (never an exception):

| kind | from | steps |
|---|---|---|
| `musique` | `decomposition` [{question, answer, doc_id}] | one hop per item, `#n` replaced by answer n, `A >> rel` asked as "What is the rel of A?" |
| `hotpotqa_bridge` | `supporting_facts` + the two supporting paragraphs | hop 1 asks the question and finds the bridge entity (the title of paragraph B, found in paragraph A), hop 2 asks about it |
| `hotpotqa_comparison` | the same | one hop per compared entity; its answer is that entity's supporting sentence |
| `hotpotqa_one_step` | any HotpotQA row the two above do not fit | the question itself, needing both paragraphs |
| `table` | `table_id` (TabFact, WTQ) | the question itself; support: the table |
| `image` | `image_id` (COCO) | the question itself (`describe_image`: with the photo described by a caption); support: the image |
| `video` | `video_id`, `evidence_span_s` | the question itself; support: any clip of that video overlapping the span |
| `paper` | the paper's step-level `steps` | its sub-questions, retrievers (through `kb_map`) and answers; its own evidence |

Intermediate answers are strings found in the supporting paragraph (HotpotQA), the dataset's own hop answers
(MuSiQue), or the gold answer for the last hop. A support is `{"ids": [...], "need": "all"|"any"}` (doc, table or
image ids) or `{"video_id", "span"}`; `data_synthesis.rejection.holds_support` checks it against the hits.

Skip reasons: `missing_fields` (the detail names them), `too_many_hops` (more hops than `max_steps`),
`bad_decomposition` (a `#n` that names no earlier hop), `missing_paragraph` (a supporting doc id not in the corpus),
`unmapped_kb` (a paper retriever that `kb_map` does not name).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from retrievers.types import Hit

ANNOTATION_SKIP_REASONS = ("missing_fields", "too_many_hops", "bad_decomposition", "missing_paragraph", "unmapped_kb")


@dataclass(frozen=True)
class GoldStep:
    """One gold retrieval step; `hits` is set only when the source ships its own evidence (the paper's file)."""

    sub_question: str
    kb: str
    answer: str
    support: dict | None = None
    hits: tuple[Hit, ...] | None = None


@dataclass(frozen=True)
class GoldPlan:
    """The gold steps of one question, its final answer, and which planner made it (`kind`)."""

    kind: str
    steps: tuple[GoldStep, ...]
    final_answer: str


@dataclass(frozen=True)
class PlanContext:
    """What planners may need besides the row: the input's KB, the corpus of text KBs, the step budget."""

    kb: str = ""
    paragraphs: dict[str, dict] = field(default_factory=dict)  # doc id -> {"title", "text"}
    kb_map: dict = field(default_factory=dict)
    max_steps: int = 3
    describe_image: bool = False


class NoPlan(Exception):
    """A row that cannot be planned: `reason` (one of `ANNOTATION_SKIP_REASONS`) and a detail."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


# A planner: (question text, gold answers, source fields, context) -> plan; raises NoPlan.
Planner = Callable[[str, tuple[str, ...], dict, PlanContext], GoldPlan]


def _need(fields: dict, *names: str) -> None:
    missing = [n for n in names if fields.get(n) in (None, "", [])]
    if missing:
        raise NoPlan("missing_fields", ", ".join(missing))


def _check_hops(n: int, ctx: PlanContext) -> None:
    if n > ctx.max_steps:
        raise NoPlan("too_many_hops", f"{n} hops > max_steps {ctx.max_steps}")


def _ids(*ids: str, need: str = "all") -> dict:
    return {"ids": [str(i) for i in ids], "need": need}


# -- MuSiQue ---------------------------------------------------------------------------------------------------------
_PLACEHOLDER = re.compile(r"#(\d+)")


def musique_question(template: str, answers: list[str]) -> str:
    """A decomposition question with `#n` replaced by the n-th earlier answer, and `A >> relation` worded.

    Raises:
        NoPlan: `bad_decomposition` when `#n` names no earlier hop.

    Example:
        >>> musique_question("#1 >> country of citizenship", ["Johann Strauss II"])
        'What is the country of citizenship of Johann Strauss II?'
    """

    def sub(m: re.Match) -> str:
        n = int(m.group(1))
        if not 1 <= n <= len(answers):
            raise NoPlan("bad_decomposition", f"{template!r} refers to #{n} with {len(answers)} earlier hop(s)")
        return answers[n - 1]

    text = " ".join(_PLACEHOLDER.sub(sub, template).split())
    if ">>" in text:
        entity, _, relation = text.partition(">>")
        text = f"What is the {relation.strip()} of {entity.strip()}?"
    text = re.sub(r"\s+([?.,])", r"\1", text)
    return text if text.endswith("?") else text + "?"


def plan_musique(question: str, golds: tuple[str, ...], fields: dict, ctx: PlanContext) -> GoldPlan:
    _need(fields, "decomposition")
    hops = fields["decomposition"]
    _check_hops(len(hops), ctx)
    answers: list[str] = []
    steps = []
    for i, hop in enumerate(hops):
        if not isinstance(hop, dict):
            raise NoPlan("missing_fields", f"decomposition[{i}] is not a mapping")
        missing = [k for k in ("question", "answer", "doc_id") if not str(hop.get(k) or "").strip()]
        if missing:
            raise NoPlan("missing_fields", f"decomposition[{i}]: {', '.join(missing)}")
        sub_q = musique_question(str(hop["question"]), answers)
        answer = str(hop["answer"]).strip()
        steps.append(GoldStep(sub_q, ctx.kb, answer, _ids(hop["doc_id"])))
        answers.append(answer)
    return GoldPlan("musique", tuple(steps), answers[-1])


# -- HotpotQA --------------------------------------------------------------------------------------------------------
def _bare_title(title: str) -> str:
    """`Lilu (mythology)` -> `Lilu`: how a paragraph's subject is written in running text."""
    return re.sub(r"\s*\([^)]*\)\s*$", "", title).strip()


def find_span(needle: str, text: str) -> str | None:
    """`needle` as written in `text` (case-insensitive, on word boundaries), or None."""
    if not needle.strip():
        return None
    m = re.search(rf"(?<!\w){re.escape(needle.strip())}(?!\w)", text, flags=re.IGNORECASE)
    return m.group(0) if m else None


def sentences(text: str) -> list[str]:
    """A paragraph cut into sentences (the shared corpus joins HotpotQA's sentences without a marker)."""
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[\"'(A-Z0-9])", text) if s.strip()]


def _supporting(fields: dict, ctx: PlanContext) -> list[tuple[str, dict, list[int]]]:
    """(doc id, paragraph, supporting sentence indices) of each supporting paragraph, in supporting-fact order."""
    _need(fields, "supporting_doc_ids", "supporting_facts")
    paragraphs = []
    for doc_id in fields["supporting_doc_ids"]:
        p = ctx.paragraphs.get(str(doc_id))
        if p is None:
            raise NoPlan("missing_paragraph", f"{doc_id} is not in the corpus of KB {ctx.kb!r}")
        paragraphs.append((str(doc_id), p))
    order = {}
    for fact in fields["supporting_facts"]:
        if isinstance(fact, list | tuple) and len(fact) == 2:
            order.setdefault(str(fact[0]), []).append(int(fact[1]))
    titles = list(order)
    paragraphs.sort(key=lambda dp: titles.index(dp[1]["title"]) if dp[1]["title"] in titles else len(titles))
    return [(d, p, order.get(p["title"], [])) for d, p in paragraphs]


def _one_step(question: str, golds: tuple[str, ...], doc_ids: list[str], ctx: PlanContext) -> GoldPlan:
    return GoldPlan("hotpotqa_one_step", (GoldStep(question, ctx.kb, golds[0], _ids(*doc_ids, need="all")),),
                    golds[0])  # fmt: skip


def plan_hotpotqa(question: str, golds: tuple[str, ...], fields: dict, ctx: PlanContext) -> GoldPlan:
    """Two hops for a bridge or comparison question whose supporting facts allow it, else one step."""
    _need(fields, "type")
    support = _supporting(fields, ctx)
    doc_ids = [d for d, _, _ in support]
    if len(support) != 2 or ctx.max_steps < 2:
        return _one_step(question, golds, doc_ids, ctx)
    answer = golds[0]
    if fields["type"] == "bridge":
        candidates = []
        for (da, pa, _), (db, pb, _) in (support, support[::-1]):
            bridge = find_span(_bare_title(pb["title"]), pa["text"])
            if bridge and (answer.lower() in ("yes", "no") or find_span(answer, pb["text"])):
                candidates.append((find_span(answer, pa["text"]) is not None, da, pa, db, pb, bridge))
        if candidates:
            _, da, pa, db, pb, bridge = min(candidates, key=lambda c: c[0])  # prefer an answer only B holds
            return GoldPlan("hotpotqa_bridge", (
                # hop 1 asks the question itself (naming paragraph A's title would leak what only retrieval can
                # know); hop 2 names the bridge entity, which is hop 1's answer, so the policy can write it too
                GoldStep(question, ctx.kb, bridge, _ids(da)),
                GoldStep(f"About {bridge}: {question}", ctx.kb, answer, _ids(db)),
            ), answer)  # fmt: skip
    elif fields["type"] == "comparison":
        steps = []
        for doc_id, p, idx in support:
            sents = sentences(p["text"])
            if not idx or idx[0] >= len(sents):
                return _one_step(question, golds, doc_ids, ctx)
            steps.append(GoldStep(f"About {_bare_title(p['title'])}: {question}", ctx.kb, sents[idx[0]],
                                  _ids(doc_id)))  # fmt: skip
        return GoldPlan("hotpotqa_comparison", tuple(steps), answer)
    return _one_step(question, golds, doc_ids, ctx)


# -- one-step kinds ---------------------------------------------------------------------------------------------------
def plan_table(question: str, golds: tuple[str, ...], fields: dict, ctx: PlanContext) -> GoldPlan:
    _need(fields, "table_id")
    # WTQ's `answers` list holds the items of one list answer ("a|b" upstream), so the answer names them all
    items = fields.get("answers")
    answer = ", ".join(golds) if isinstance(items, list) and len(golds) > 1 else golds[0]
    return GoldPlan("table", (GoldStep(question, ctx.kb, answer, _ids(fields["table_id"])),), answer)


def image_sub_question(question: str, captions: list[str]) -> str:
    """The question with the photo described by a caption, so a caption KB can find it.

    Example:
        >>> image_sub_question("How many cups are there in the image?", ["A woman holding a knife."])
        'How many cups are there in the image of a woman holding a knife?'
    """
    # a caption that opens like a noun phrase ("A man …") reads well after "the image of"; else the first one
    phrase = re.compile(r"^(a|an|the|some|two|three|four|several|many)\b", re.IGNORECASE)
    caption = next((c for c in captions if phrase.match(str(c).strip())), captions[0])
    caption = " ".join(str(caption).split()).rstrip(". ")
    described = f"the image of {caption[:1].lower()}{caption[1:]}"
    text, n = re.subn(r"\bthe (image|photo|picture)\b", described, question, count=1, flags=re.IGNORECASE)
    return text if n else f"{question} (the image shows {caption[:1].lower()}{caption[1:]})"


def plan_image(question: str, golds: tuple[str, ...], fields: dict, ctx: PlanContext) -> GoldPlan:
    """One step with the question; with `describe_image`, the photo is described by one of its human captions (what
    a VL policy looking at it would write for a caption KB; a text query then finds its photo nearly always, since
    the caption is in the photo's document)."""
    _need(fields, "image_id", *(["captions"] if ctx.describe_image else []))
    sub_q = image_sub_question(question, fields["captions"]) if ctx.describe_image else question
    return GoldPlan("image", (GoldStep(sub_q, ctx.kb, golds[0], _ids(fields["image_id"])),), golds[0])


def plan_video(question: str, golds: tuple[str, ...], fields: dict, ctx: PlanContext) -> GoldPlan:
    _need(fields, "video_id", "evidence_span_s")
    span = fields["evidence_span_s"]
    if not isinstance(span, list | tuple) or len(span) != 2:
        raise NoPlan("missing_fields", f"evidence_span_s is not [start, end]: {span!r}")
    support = {"video_id": str(fields["video_id"]), "span": [float(span[0]), float(span[1])]}
    return GoldPlan("video", (GoldStep(question, ctx.kb, golds[0], support),), golds[0])


# -- the paper's step-level file --------------------------------------------------------------------------------------
_EVIDENCE = re.compile(r"(?:^|\n|:)\s*(ter|tir|tar)-(\d+):\s*")
_EVIDENCE_END = re.compile(r"\n\s*Give me the answer.*$", re.DOTALL)
PAPER_TAGS = {"ter": "text retriever", "tir": "text image retriever", "tar": "table retriever"}


def paper_hits(problem: str, kb: str, modality: str) -> tuple[Hit, ...]:
    """The evidence lines (`ter-0: …`) of one of the paper's answer prompts as hits of KB `kb` (no ids, no scores)."""
    from retrievers.types import Doc

    body = _EVIDENCE_END.sub("", problem)
    marks = list(_EVIDENCE.finditer(body))
    hits = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(body)
        text = " ".join(body[m.end() : end].split())
        doc = Doc(id=f"paper-{m.group(1)}-{m.group(2)}", text=text or "(empty)", kb=kb, modality=modality)
        hits.append(Hit(doc, 0.0, i, kb))
    return tuple(hits)


def plan_paper(question: str, golds: tuple[str, ...], fields: dict, ctx: PlanContext) -> GoldPlan:
    """The paper's steps: each `ret` (query + one retriever) and the `ans` after it; `none` ends the plan."""
    _need(fields, "steps")
    raw = fields["steps"]
    kb_map = {str(k).strip().lower(): v for k, v in ctx.kb_map.items()}
    steps: list[GoldStep] = []
    i = 0
    while i < len(raw) - 1:
        ret, ans = raw[i], raw[i + 1]
        if ret.get("step_type") != "ret" or not isinstance(ret.get("answer"), dict):
            break
        query = str(ret["answer"].get("query") or "").strip()
        rets = [str(r).strip().lower() for r in ret["answer"].get("retriever") or []]
        if not query or query.lower() == "none" or rets == ["none"]:
            break
        if len(rets) != 1 or rets[0] not in kb_map:
            raise NoPlan("unmapped_kb", f"step {i}: retriever {rets} (kb_map: {sorted(kb_map)})")
        if ans.get("step_type") != "ans" or not str(ans.get("answer") or "").strip():
            raise NoPlan("missing_fields", f"step {i + 1}: no intermediate answer after the retrieval")
        kb = kb_map[rets[0]]
        modality = "table" if "table" in rets[0] else "text"
        steps.append(GoldStep(query, kb, " ".join(str(ans["answer"]).split()), None,
                              paper_hits(str(ans.get("problem", "")), kb, modality)))  # fmt: skip
        i += 2
    _check_hops(len(steps), ctx)
    return GoldPlan("paper", tuple(steps), golds[0])


PLANNERS: dict[str, Planner] = {
    "musique": plan_musique,
    "hotpotqa": plan_hotpotqa,
    "table": plan_table,
    "image": plan_image,
    "video": plan_video,
    "paper": plan_paper,
}


def planner_for(input_format: str, fields: dict) -> str:
    """Which planner a row of `input_format` gets (shared text rows: by their fields)."""
    if input_format == "shared_text":
        if "decomposition" in fields or fields.get("dataset") == "musique":
            return "musique"
        return "hotpotqa"
    by_format = {"tabfact": "table", "wtq": "table", "coco": "image", "video": "video", "r1router_steps": "paper"}
    if input_format not in by_format:
        raise ValueError(f"the annotation teacher has no planner for input format {input_format!r}; use one of "
                         f"{sorted(by_format) + ['shared_text']}")  # fmt: skip
    return by_format[input_format]
