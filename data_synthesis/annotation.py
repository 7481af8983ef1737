"""The annotation teacher: gold trajectories from each dataset's own supervision, with the real retrievers' evidence.

No model is involved. For every question, `data_synthesis.gold_plans` turns the row's supervision (MuSiQue
decompositions, HotpotQA supporting facts, table / image / clip ids, the paper's released steps) into gold steps;
`AnnotationTeacher.run_batch` then sends each sub-question to its KB (one batched search per KB and hop, top
`top_k_hits` hits, the question's image attached as the live loop attaches it) and writes the trajectory the live
agent loop would have written had the policy produced exactly these steps:

- plan think: "I need to know this first: …" / "From step i, I know: … Next I need: …";
- answer think: which evidence line holds the answer ("text-1 (Title) gives the answer: …");
- a stop plan (`None` / `None`, "I know enough to answer the original question.") after the last hop when fewer
  than `max_steps` hops were used, so the step records end as the loop's do (stop reason `answered`; `max_steps`
  otherwise);
- the final think and answer (the plan's final answer: the last hop's answer, or the gold).

The trajectory's metadata keeps each step's gold support (`gold_support`); the job's rejection
(`data_synthesis.rejection`) keeps it only when every step's hits hold that support and the final answer scores 1,
like any teacher's. Steps from the paper's file carry the paper's own evidence (no corpus of ours holds it), so
they have no support to check: only the answer rule applies to them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from agent.kbs import KnowledgeBase
from agent.step_records import kb_id
from agent.types import Question, Step, Trajectory
from data_synthesis.config import SynthConfig
from data_synthesis.gold_plans import PLANNERS, GoldPlan, NoPlan, PlanContext, planner_for
from data_synthesis.inputs import Skip, read_inputs
from data_synthesis.rejection import support_rank
from retrievers.types import Hit, Query

logger = logging.getLogger(__name__)

STOP_THINK = "I know enough to answer the original question."


def _kb_configs(cfg: SynthConfig) -> dict:
    from retrievers.config import load_kb_configs

    files = [cfg.kb_config] if isinstance(cfg.kb_config, str) else list(cfg.kb_config)
    configs = {c.name: c for f in files if f for c in load_kb_configs(f)}
    if cfg.kbs:
        configs = {n: c for n, c in configs.items() if n in cfg.kbs}
    return configs


def _paragraphs(corpus: str) -> dict[str, dict]:
    from retrievers.chunking import read_text_corpus

    return {r["id"]: {"title": r["title"], "text": r["text"]} for r in read_text_corpus(corpus)}


def plan_questions(cfg: SynthConfig) -> tuple[list[Question], list[Skip], dict[str, GoldPlan]]:
    """Read the inputs and plan every question: (plannable questions, skips, plans by question id).

    Raises:
        ValueError: an input's `kb` (or a `kb_map` target) is not a KB of `kb_config`; no planner for a format.
    """
    configs = _kb_configs(cfg)
    questions, skips = read_inputs(cfg.inputs, with_fields=True)
    contexts: dict[int, PlanContext] = {}
    for n, spec in enumerate(cfg.inputs):
        for name in [spec.kb] if spec.kb else list(spec.kb_map.values()):
            if name not in configs:
                raise ValueError(f"input {spec.path}: KB {name!r} is not in {cfg.kb_config} (KBs: {sorted(configs)}); "
                                 "set `kb:` / `kb_map:` to one of them")  # fmt: skip
        contexts[n] = PlanContext(kb=spec.kb, kb_map=dict(spec.kb_map), max_steps=cfg.max_steps,
                                  describe_image=spec.describe_image)  # fmt: skip
    corpora: dict[str, dict[str, dict]] = {}
    kept: list[Question] = []
    plans: dict[str, GoldPlan] = {}
    for q in questions:
        meta = dict(q.metadata)
        fields, n = meta.pop("fields"), meta.pop("input")
        spec, ctx = cfg.inputs[n], contexts[n]
        kind = planner_for(spec.format, fields)
        if kind == "hotpotqa":
            corpus = str(configs[spec.kb].corpus)
            if corpus not in corpora:
                corpora[corpus] = _paragraphs(corpus)
            ctx = replace(ctx, paragraphs=corpora[corpus])
        try:
            plan = PLANNERS[kind](q.question, tuple(q.answers or ()), fields, ctx)
        except NoPlan as e:
            skips.append(Skip(q.id, meta["dataset"], e.reason, e.detail, meta["modality"]))
            continue
        plans[q.id] = plan
        kept.append(replace(q, metadata={**meta, "annotation": plan.kind}))
    logger.info("annotation: planned %d questions (%s)", len(kept),
                {k: sum(p.kind == k for p in plans.values()) for k in sorted({p.kind for p in plans.values()})})  # fmt: skip
    return kept, skips, plans


def plan_think(i: int, sub_question: str, previous_answer: str) -> str:
    """The templated reasoning of retrieval step `i` (0-based)."""
    if i == 0:
        return f"I need to know this first: {sub_question}"
    return f"From step {i}, I know: {previous_answer}. Next I need: {sub_question}"


def answer_think(answer: str, hits: Sequence[Hit], support: dict | None) -> str:
    """Which evidence line (`kb-i`, as the answer prompt numbers them) holds the answer."""
    if support is None:
        return f"The evidence gives the answer: {answer}"
    rank = support_rank(hits, support)
    if rank is None:
        return f"The evidence does not show it; the expected answer is {answer}"
    hit = hits[rank]
    title = f" ({hit.doc.title})" if hit.doc.title else ""
    return f"{hit.kb}-{rank}{title} gives the answer: {answer}"


def final_think(answers: Sequence[str], final: str) -> str:
    """The templated reasoning of the final step over the intermediate answers."""
    if not answers:
        return f"I can answer without looking anything up: {final}"
    if len(answers) == 1:
        return f"The sub-question's answer answers the question: {final}"
    return f"Putting the answers together ({'; '.join(answers)}), the answer is {final}"


class AnnotationTeacher:
    """Turns gold plans into trajectories with real evidence (see the module docstring).

    Args:
        kbs: the KBs keyed by display name (as the agent loop takes them).
        plans: gold plans by question id (`plan_questions`).
        top_k: hits per retrieval (capped by each KB's `k`, as in the loop).
        max_steps: the loop's step budget; a plan with fewer hops ends with a stop plan.
    """

    name = "annotation"

    def __init__(self, kbs: dict[str, KnowledgeBase], plans: dict[str, GoldPlan], top_k: int, max_steps: int) -> None:
        self.by_name = {kb.name: kb for kb in kbs.values()}
        self.plans = plans
        self.top_k = top_k
        self.max_steps = max_steps

    def _search(self, items: list[tuple[Question, str, str]]) -> list[list[Hit]]:
        """Hits for `(question, kb name, sub-question)` items: one batched search per KB."""
        out: list[list[Hit]] = [[] for _ in items]
        by_kb: dict[str, list[int]] = {}
        for i, (_, kb, _) in enumerate(items):
            by_kb.setdefault(kb, []).append(i)
        for name, idx in by_kb.items():
            kb = self.by_name[name]
            queries = [Query(text=items[i][2], image=next(iter(items[i][0].images), None)) for i in idx]
            results = kb.retriever.search(queries, min(self.top_k, kb.k) if kb.k else self.top_k)
            for i, hits in zip(idx, results, strict=True):
                out[i] = list(hits)
        return out

    def run_batch(self, questions: Sequence[Question]) -> list[Trajectory]:
        """One gold trajectory per question (id `<question id>#0`), in order."""
        plans = [self._plan(q) for q in questions]
        hits: list[list[list[Hit]]] = [[[] for _ in p.steps] for p in plans]
        for hop in range(max((len(p.steps) for p in plans), default=0)):
            todo = [(qi, p.steps[hop]) for qi, p in enumerate(plans) if hop < len(p.steps)]
            search = [(qi, s) for qi, s in todo if s.hits is None]
            found = self._search([(questions[qi], s.kb, s.sub_question) for qi, s in search])
            for (qi, _), h in zip(search, found, strict=True):
                hits[qi][hop] = h
            for qi, s in todo:
                if s.hits is not None:
                    hits[qi][hop] = list(s.hits)
        return [self._trajectory(q, p, h) for q, p, h in zip(questions, plans, hits, strict=True)]

    def _plan(self, q: Question) -> GoldPlan:
        """`q`'s gold plan, its steps naming their KB by name (`Step.kb`'s identifier); an unloaded KB is refused."""
        plan, where = self.plans[q.id], f"question {q.id}: its gold plan"
        kbs = self.by_name.values()
        return replace(plan, steps=tuple(replace(s, kb=kb_id(s.kb, kbs, "name", where)) for s in plan.steps))

    def _trajectory(self, q: Question, plan: GoldPlan, hits: list[list[Hit]]) -> Trajectory:
        steps, previous = [], ""
        for i, (gold, h) in enumerate(zip(plan.steps, hits, strict=True)):
            steps.append(Step(index=i, think=plan_think(i, gold.sub_question, previous), sub_question=gold.sub_question,
                              kb=gold.kb, hits=tuple(h), answer_think=answer_think(gold.answer, h, gold.support),
                              answer=gold.answer))  # fmt: skip
            previous = gold.answer
        stop_reason = "max_steps"
        if len(steps) < self.max_steps:
            steps.append(Step(index=len(steps), think=STOP_THINK))
            stop_reason = "answered"
        answers = [g.answer for g in plan.steps]
        meta = {**q.metadata, "sample": 0, "model": self.name, "prompt_tokens": 0, "completion_tokens": 0,
                "gold_support": [g.support for g in plan.steps]}  # fmt: skip
        return Trajectory(id=f"{q.id}#0", question=q.question, images=q.images, steps=tuple(steps),
                          final_think=final_think(answers, plan.final_answer), final_answer=plan.final_answer,
                          stop_reason=stop_reason, gold=q.answers, metadata=meta)  # fmt: skip
