"""The methods compared by `kbrouter eval`: baselines and the step-wise agent, over the same policy and KBs.

Each method answers a batch of questions in lockstep (one batched generation per stage for the whole batch, one
batched search per KB) and returns one `Trajectory` per question, so every method is scored and plotted the
same way: a retrieval is a `Step` (its `kb` is the KB name, or `all` for a search of every KB), the answer is
`final_answer`. The agent methods are `agent.loop.StepAgent` itself, not a copy of its loop.

| name | what it does |
|---|---|
| `no_retrieval` | answer from the question alone |
| `always_no`, `always_yes` | no model: that word for every yes/no question, no answer to the rest (what a constant earns) |
| `rag_<kb>` | search the question in one KB, answer from its top-k |
| `rag_all` | search every KB, concatenate their top-k, answer |
| `ircot` | IRCoT: alternate one reasoning sentence and a search with it, up to `max_steps` |
| `iter_retgen` | Iter-RetGen: search with question + previous answer, regenerate, `max_steps` rounds |
| `router` | UniversalRAG-style one-shot router: pick one KB (or none) for the question, retrieve once, answer |
| `agent` | the step-wise agent, prompted (and any variant named in the config's `agent_variants` / `checkpoints`) |
| `<variant>` | a variant with `method: <one above>` runs that method with its own policy and settings (`eval.config`) |
| `agent_random` | ablation: the agent with each chosen KB replaced by a uniformly random one |
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.backends.base import Completion, Message, Policy, SamplingParams, last_user_text
from agent.kbs import KnowledgeBase
from agent.loop import AgentConfig, StepAgent, use_constrained
from agent.protocol import (
    StepGrammar,
    answer_grammar,
    answer_messages,
    final_messages,
    kb_list,
    parse_answer,
    render_hits,
    ret_content,
    ret_span,
    route_grammar,
    shown_answer_grammars,
    strip_tags,
)
from agent.types import Question, Step, Trajectory
from retrievers.types import Hit, Query


@dataclass
class MethodContext:
    """What every method gets: the policy, the KBs (by display name) and the loop settings."""

    policy: Policy
    kbs: dict[str, KnowledgeBase]
    agent: AgentConfig = field(default_factory=AgentConfig)
    seed: int = 0
    k_per_kb: int = 2  # hits per KB for the methods that search every KB (rag_all, ircot, iter_retgen)

    @functools.cached_property
    def step_agent(self) -> StepAgent:
        """The step agent of this context, built once: its grammars and route prior (encoder, KB profiles) then load
        once per method, not once per lockstep batch."""
        return StepAgent(self.policy, self.kbs, self.agent)

    def grammar(self, step: str) -> StepGrammar | None:
        """The grammar a baseline decodes `step` in ("route": the router's KB choice; "answer" / "final": an answer
        step) when `agent.constrained` resolves on for this policy, else None. `on` with a backend that has no
        structured output raises here, before the method generates anything, and so does `agent.answer_words: shown`
        without a grammar (its answers are made of their prompt's words by the grammar alone)."""
        if not use_constrained(self.agent.constrained, self.policy):
            if self.agent.answer_words != "free":
                raise ValueError(
                    f"agent.answer_words: {self.agent.answer_words} needs constrained decoding, and this method "
                    f"decodes without it (agent.constrained: {self.agent.constrained}, policy {self.policy.name}); set "
                    "agent.constrained: on, or agent.answer_words: free"
                )
            return None
        if step == "route":
            return route_grammar(tuple(self.kbs))
        return answer_grammar(self.agent.final_tokens if step == "final" else self.agent.answer_tokens)


# A method answers a batch of questions in lockstep: (questions, context) -> one trajectory per question.
MethodFn = Callable[[Sequence[Question], MethodContext], list[Trajectory]]


class _Counter:
    """Generates for a batch and keeps per-question token counts."""

    def __init__(self, ctx: MethodContext, n: int) -> None:
        self.ctx, self.prompt, self.completion = ctx, [0] * n, [0] * n

    def generate(
        self,
        idx: list[int],
        convs: list[list[Message]],
        tokens: int,
        stop: tuple[str, ...],
        salt: int = 0,
        grammar: StepGrammar | None = None,
    ) -> list[Completion]:
        if not idx:
            return []
        ebnf: str | tuple[str, ...] | None = grammar.ebnf if grammar else None
        if grammar is not None and grammar.kind == "answer" and self.ctx.agent.answer_words != "free":
            # an answer step: one grammar per prompt's words (`found` reads as `shown`: no intermediate answers here)
            labels = [kb.name for kb in self.ctx.kbs.values()]
            ebnf = shown_answer_grammars([last_user_text(c) for c in convs], tokens, labels)
        outs = self.ctx.policy.generate(convs, self.ctx.agent.sampling(tokens, stop, salt, grammar=ebnf))
        for i, out in zip(idx, outs, strict=True):
            self.prompt[i] += out.prompt_tokens
            self.completion[i] += out.completion_tokens
        return outs

    def meta(self, i: int, **extra: object) -> dict:
        return {
            "model": self.ctx.policy.name,
            "prompt_tokens": self.prompt[i],
            "completion_tokens": self.completion[i],
            **extra,
        }


def _answer_of(out: Completion) -> tuple[str, str, tuple[str, ...]]:
    """(think, answer, format errors) of an answer completion; a malformed one falls back to its bare text."""
    if out.finish_reason == "error":
        return "", "", ("backend_error",)
    parsed = parse_answer(out.text, require_think=False)
    return parsed.think or "", parsed.answer or strip_tags(out.text), parsed.errors


def _search(kb: KnowledgeBase, queries: list[Query], k: int) -> list[list[Hit]]:
    return kb.retriever.search(queries, min(k, kb.k) if kb.k else k) if queries else []


def _search_all(ctx: MethodContext, queries: list[Query]) -> list[list[Hit]]:
    """Every KB's top `k_per_kb` for each query, concatenated in KB order."""
    out: list[list[Hit]] = [[] for _ in queries]
    for kb in ctx.kbs.values():
        for i, hits in enumerate(_search(kb, queries, ctx.k_per_kb)):
            out[i].extend(hits)
    return out


def _query(q: Question, text: str) -> Query:
    return Query(text=text, image=next(iter(q.images), None))


def _trajectory(
    q: Question, steps: list[Step], think: str, answer: str, raw: Sequence[str], errors: Sequence[str], meta: dict
) -> Trajectory:
    stop = "backend_error" if "backend_error" in errors else ("format_error" if errors else "answered")
    return Trajectory(
        id=q.id,
        question=q.question,
        images=q.images,
        steps=tuple(steps),
        final_think=think,
        final_answer=answer,
        final_raw=tuple(raw),
        stop_reason=stop,
        gold=q.answers,
        metadata={**q.metadata, **meta, "final_errors": list(errors)},
    )


def no_retrieval(questions: Sequence[Question], ctx: MethodContext) -> list[Trajectory]:
    """Answer each question from the policy's own knowledge (the final-answer prompt with no history)."""
    gen = _Counter(ctx, len(questions))
    idx = list(range(len(questions)))
    outs = gen.generate(
        idx,
        [final_messages(q.question, [], q.images, ctx.agent.prompt_settings) for q in questions],
        ctx.agent.final_tokens,
        ("</answer>",),
        grammar=ctx.grammar("final"),
    )
    out = []
    for i, (q, o) in enumerate(zip(questions, outs, strict=True)):
        think, answer, errors = _answer_of(o)
        out.append(_trajectory(q, [], think, answer, [o.text], errors, gen.meta(i, searches=0)))
    return out


_NO_MODEL = {"model": "none", "prompt_tokens": 0, "completion_tokens": 0, "searches": 0}


def constant_answer(word: str) -> MethodFn:
    """A floor with no model: `word` for every yes/no question (`answer_type`), an empty answer to every other.

    A yes/no split that leans one way pays a method that leans the same way; this shows how much.
    """

    def method(questions: Sequence[Question], ctx: MethodContext) -> list[Trajectory]:
        return [
            _trajectory(q, [], "", word if q.metadata.get("answer_type") == "yesno" else "", (), (), _NO_MODEL)
            for q in questions
        ]

    method.__name__ = f"always_{word}"
    return method


def _answer_with_hits(
    questions: Sequence[Question],
    ctx: MethodContext,
    hits: list[list[Hit]],
    kb_of: list[str | None],
    searches: list[int],
) -> list[Trajectory]:
    """One batched answer over each question's evidence; `kb_of[i] is None` means answer without retrieval."""
    gen = _Counter(ctx, len(questions))
    convs = [
        answer_messages(q.question, h, q.images, ctx.agent.prompt_settings)
        if kb is not None
        else final_messages(q.question, [], q.images, ctx.agent.prompt_settings)
        for q, h, kb in zip(questions, hits, kb_of, strict=True)
    ]
    t0 = time.perf_counter()
    outs = gen.generate(
        list(range(len(questions))), convs, ctx.agent.answer_tokens, ("</answer>",), grammar=ctx.grammar("answer")
    )
    answer_s = time.perf_counter() - t0
    out = []
    for i, (q, o) in enumerate(zip(questions, outs, strict=True)):
        think, answer, errors = _answer_of(o)
        steps = (
            [
                Step(
                    index=0,
                    sub_question=q.question,
                    kb=kb_of[i],
                    hits=tuple(hits[i]),
                    answer=answer,
                    timings={"answer_s": answer_s},
                )
            ]
            if kb_of[i] is not None
            else []
        )
        out.append(_trajectory(q, steps, think, answer, [o.text], errors, gen.meta(i, searches=searches[i])))
    return out


def single_kb_rag(kb_name: str) -> MethodFn:
    """`rag_<kb>`: search the question in the KB named `kb_name`, answer from its top-k."""

    def run(questions: Sequence[Question], ctx: MethodContext) -> list[Trajectory]:
        kb = next(kb for kb in ctx.kbs.values() if kb.name == kb_name)
        hits = _search(kb, [_query(q, q.question) for q in questions], ctx.agent.top_k)
        return _answer_with_hits(questions, ctx, hits, [kb.name] * len(questions), [1] * len(questions))

    return run


def rag_all(questions: Sequence[Question], ctx: MethodContext) -> list[Trajectory]:
    """Search every KB with the question; answer from all their hits concatenated."""
    hits = _search_all(ctx, [_query(q, q.question) for q in questions])
    return _answer_with_hits(questions, ctx, hits, ["all"] * len(questions), [len(ctx.kbs)] * len(questions))


ROUTER_SYSTEM = """Choose where to look up the answer to a question, before answering it.
Knowledge bases:
{kb_list}
- None: no lookup is needed (common knowledge or simple reasoning)
Reply with one name from the list inside <ret></ret>, for example <ret>{example}</ret>."""


def parse_route(text: str, names: Sequence[str]) -> str | None:
    """The KB display name a router completion picks (case-insensitive), or None for `None`/unparsable."""
    content = ret_content(text)
    choice = (text if content is None else content).strip().lower()
    for name in sorted(names, key=len, reverse=True):  # longest first: "Table Retriever" inside "WikiTable ..."
        if name.lower() == choice or (content is None and name.lower() in choice):
            return name
    return None


def router(questions: Sequence[Question], ctx: MethodContext) -> list[Trajectory]:
    """UniversalRAG-style: one routing decision per question (a KB or none), one retrieval, one answer."""
    gen = _Counter(ctx, len(questions))
    names = list(ctx.kbs)
    system = ROUTER_SYSTEM.format(
        kb_list=kb_list([(kb.display_name, kb.description) for kb in ctx.kbs.values()]),
        example=names[0] if names else "None",
    )
    convs = [
        [{"role": "system", "content": system}, {"role": "user", "content": f"Question: {q.question}"}]
        for q in questions
    ]
    grammar = ctx.grammar("route")  # constrained: the reply is exactly <ret>NAME</ret> or <ret>None</ret>
    tokens = 24 if grammar is None else max(24, grammar.max_tokens)  # the grammar closes within it
    routes = gen.generate(list(range(len(questions))), convs, tokens, ("</ret>",), grammar=grammar)
    chosen = [parse_route(o.text, names) for o in routes]
    hits: list[list[Hit]] = [[] for _ in questions]
    for display in set(c for c in chosen if c):
        idx = [i for i, c in enumerate(chosen) if c == display]
        for i, h in zip(
            idx,
            _search(ctx.kbs[display], [_query(questions[i], questions[i].question) for i in idx], ctx.agent.top_k),
            strict=True,
        ):
            hits[i] = h
    out = _answer_with_hits(
        questions, ctx, hits, [ctx.kbs[c].name if c else None for c in chosen], [1 if c else 0 for c in chosen]
    )
    # `route`: the KB searched, `none` (the router said None) or `format_error` (no KB name and no None in its reply)
    decisions = [
        ctx.kbs[c].name if c else "none" if _says_none(o.text) else "format_error"
        for c, o in zip(chosen, routes, strict=True)
    ]
    return [
        _with_meta(
            t,
            route_raw=o.text,
            route=decisions[i],
            prompt_tokens=t.metadata["prompt_tokens"] + gen.prompt[i],
            completion_tokens=t.metadata["completion_tokens"] + gen.completion[i],
        )
        for i, (t, o) in enumerate(zip(out, routes, strict=True))
    ]


def _says_none(text: str) -> bool:
    content = ret_content(text)
    return (text if content is None else content).strip().strip(".").lower() == "none"


def _with_meta(t: Trajectory, **extra: object) -> Trajectory:
    return Trajectory.from_dict({**t.to_dict(), "metadata": {**t.metadata, **extra}})


IRCOT_SYSTEM = """You answer a question by reasoning one sentence at a time over the evidence.
Write ONLY the next sentence of reasoning. When you know the answer, write: So the answer is: <short answer>"""
_ANSWER_IS = re.compile(r"answer is\s*:?\s*(.+)", re.IGNORECASE)


def ircot(questions: Sequence[Question], ctx: MethodContext) -> list[Trajectory]:
    """IRCoT: search with the question, then alternate a reasoning sentence and a search with that sentence."""
    n = len(questions)
    gen = _Counter(ctx, n)
    hits = _search_all(ctx, [_query(q, q.question) for q in questions])
    steps: list[list[Step]] = [
        [Step(index=0, sub_question=q.question, kb="all", hits=tuple(h))] for q, h in zip(questions, hits, strict=True)
    ]
    cot: list[list[str]] = [[] for _ in questions]
    done: list[str | None] = [None] * n
    for step_i in range(1, ctx.agent.max_steps + 1):
        idx = [i for i in range(n) if done[i] is None]
        if not idx:
            break
        evidence = {
            i: render_hits(hits[i], ctx.agent.evidence_chars, questions[i].question, ctx.agent.evidence_focus)
            for i in idx
        }
        convs = [
            [
                {"role": "system", "content": IRCOT_SYSTEM},
                {
                    "role": "user",
                    "content": f"Evidence:\n{evidence[i]}\n\n"
                    f"Question: {questions[i].question}"
                    f"\nReasoning so far: {' '.join(cot[i]) or '(none)'}\nNext sentence:",
                },
            ]
            for i in idx
        ]
        outs = gen.generate(idx, convs, ctx.agent.plan_tokens, ("\n",), salt=step_i)
        search_idx = []
        for i, o in zip(idx, outs, strict=True):
            sentence = " ".join(strip_tags(o.text).split()[:60])
            cot[i].append(sentence)
            m = _ANSWER_IS.search(sentence)
            if m:
                done[i] = m.group(1).strip().rstrip(".")
            elif step_i < ctx.agent.max_steps and sentence:
                search_idx.append(i)
        new = _search_all(ctx, [_query(questions[i], cot[i][-1]) for i in search_idx])
        for i, h in zip(search_idx, new, strict=True):
            steps[i].append(
                Step(index=len(steps[i]), think=cot[i][-1], sub_question=cot[i][-1], kb="all", hits=tuple(h))
            )
            hits[i] = [*hits[i], *h][-4 * max(1, len(ctx.kbs)) * ctx.k_per_kb :]  # keep the prompt bounded
    # questions whose reasoning never said "the answer is" get one answer call over all their evidence
    rest = [i for i in range(n) if done[i] is None]
    outs = gen.generate(
        rest,
        [
            answer_messages(questions[i].question, hits[i], questions[i].images, ctx.agent.prompt_settings)
            for i in rest
        ],
        ctx.agent.answer_tokens,
        ("</answer>",),
        salt=99,
    )
    final = {i: _answer_of(o) + (o.text,) for i, o in zip(rest, outs, strict=True)}
    out = []
    for i, q in enumerate(questions):
        think, answer, errors, raw = final.get(i, (" ".join(cot[i]), done[i] or "", (), ""))
        out.append(
            _trajectory(
                q,
                steps[i],
                think,
                answer,
                [raw] if raw else [],
                errors,
                gen.meta(i, searches=len(steps[i]) * len(ctx.kbs), cot=cot[i]),
            )
        )
    return out


def iter_retgen(questions: Sequence[Question], ctx: MethodContext) -> list[Trajectory]:
    """Iter-RetGen: `max_steps` rounds of search (question + previous answer) then generation over the hits."""
    n = len(questions)
    gen = _Counter(ctx, n)
    answers = [""] * n
    steps: list[list[Step]] = [[] for _ in questions]
    last: list[tuple[str, str, tuple[str, ...], str]] = [("", "", (), "")] * n
    for r in range(max(1, ctx.agent.max_steps)):
        queries = [f"{q.question} {answers[i]}".strip() for i, q in enumerate(questions)]
        hits = _search_all(ctx, [_query(q, text) for q, text in zip(questions, queries, strict=True)])
        outs = gen.generate(
            list(range(n)),
            [
                answer_messages(q.question, h, q.images, ctx.agent.prompt_settings)
                for q, h in zip(questions, hits, strict=True)
            ],
            ctx.agent.answer_tokens,
            ("</answer>",),
            salt=r,
        )
        for i, o in enumerate(outs):
            last[i] = _answer_of(o) + (o.text,)
            answers[i] = last[i][1]
            steps[i].append(Step(index=r, sub_question=queries[i], kb="all", hits=tuple(hits[i]), answer=answers[i]))
    return [
        _trajectory(
            q,
            steps[i],
            last[i][0],
            last[i][1],
            [last[i][3]],
            last[i][2],
            gen.meta(i, searches=len(steps[i]) * len(ctx.kbs)),
        )
        for i, q in enumerate(questions)
    ]


def _agent_trajectories(agent: StepAgent, questions: Sequence[Question]) -> list[Trajectory]:
    out = []
    for t in agent.run_batch(list(questions)):
        out.append(_with_meta(t, searches=len(t.retrieval_steps)))
    return out


def step_agent(questions: Sequence[Question], ctx: MethodContext) -> list[Trajectory]:
    """The step-wise agent (`agent.loop.StepAgent`) with the context's policy."""
    return _agent_trajectories(ctx.step_agent, questions)


class RandomRoutePolicy:
    """Wraps a policy: in plan completions, a chosen KB is replaced by one drawn uniformly at random.

    The draw is seeded by the conversation, so a rerun routes the same way. `None` (stop) is left alone: the
    ablation changes *where* the agent looks, not *whether* it looks.
    """

    def __init__(self, inner: Policy, kb_names: Sequence[str], seed: int = 0) -> None:
        self.inner, self.kb_names, self.seed = inner, list(kb_names), seed
        self.name = f"{inner.name}+random-route"

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        outs = self.inner.generate(conversations, params)
        if "</ret>" not in params.stop:
            return outs
        result = []
        for conv, out in zip(conversations, outs, strict=True):
            span = ret_span(out.text)
            policy_ret = out.text[span[0] : span[1]].strip() if span else ""
            if span and policy_ret.lower() not in {"none", ""}:
                key = hashlib.sha256(f"{self.seed}:{json.dumps(conv, sort_keys=True, default=str)}".encode()).digest()
                choice = random.Random(key).choice(self.kb_names)
                text = out.text[: span[0]] + choice + out.text[span[1] :]
                out = Completion(
                    text,
                    out.prompt_tokens,
                    out.completion_tokens,
                    out.finish_reason,
                    {**out.metadata, "policy_ret": policy_ret},
                )
            result.append(out)
        return result


def random_route_agent(questions: Sequence[Question], ctx: MethodContext) -> list[Trajectory]:
    """Ablation: the agent with every chosen KB replaced by a random one."""
    policy = RandomRoutePolicy(ctx.policy, list(ctx.kbs), ctx.seed)
    return _agent_trajectories(StepAgent(policy, ctx.kbs, ctx.agent), questions)


BASE_METHODS: dict[str, MethodFn] = {
    "no_retrieval": no_retrieval,
    "always_no": constant_answer("no"),
    "always_yes": constant_answer("yes"),
    "rag_all": rag_all,
    "ircot": ircot,
    "iter_retgen": iter_retgen,
    "router": router,
    "agent": step_agent,
    "agent_random": random_route_agent,
}
NON_RETRIEVING = frozenset({"no_retrieval", "always_no", "always_yes"})  # no recall@k for these
AGENT_METHODS = frozenset({"agent", "agent_random"})  # methods that run the step protocol (plan / answer / final)
ROUTING_METHODS = AGENT_METHODS | {"router"}  # methods that choose a KB (routing accuracy); agent variants too
SINGLE_KB_ALL = "single_kb"  # in a config's method list: one `rag_<kb>` per configured KB


def reserved_method_name(name: str) -> bool:
    """Whether `name` is taken by a built-in method (so an agent variant may not use it)."""
    return name in BASE_METHODS or name == SINGLE_KB_ALL or name.startswith("rag_")


def available_methods(kb_names: Sequence[str], variants: Mapping[str, str] | None = None) -> dict[str, MethodFn]:
    """Every valid method name for these KBs, and the variants (name -> the built-in method each one runs with its
    own settings: `agent` for the step agent, or e.g. `router`, `rag_all`).

    Raises:
        ValueError: a variant runs a method these KBs do not have (e.g. `rag_images` with no `images` KB).
    """
    out = dict(BASE_METHODS)
    out.update({f"rag_{name}": single_kb_rag(name) for name in kb_names})
    builtin = dict(out)  # a variant runs a built-in method, never another variant
    for name, base in (variants or {}).items():
        if base not in builtin:
            raise ValueError(f"agent_variants.{name}: method {base!r} is not one of {', '.join(builtin)}")
        out[name] = builtin[base]
    return out


def resolve_methods(
    requested: Sequence[str], kb_names: Sequence[str], variants: Mapping[str, str] | None = None
) -> list[str]:
    """Expand `single_kb` and check every name.

    Raises:
        ValueError: an unknown method name; the message lists the valid ones.
    """
    valid = available_methods(kb_names, variants)
    out: list[str] = []
    for name in requested:
        names = [f"rag_{kb}" for kb in kb_names] if name == SINGLE_KB_ALL else [name]
        for n in names:
            if n not in valid:
                raise ValueError(f"unknown method {n!r}; valid methods: {', '.join([*valid, SINGLE_KB_ALL])}")
            if n not in out:
                out.append(n)
    return out
