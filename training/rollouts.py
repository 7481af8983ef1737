"""Live step trees for online Step-GRPO: a spine rollout picks the anchor states, G siblings branch from each.

One question gives one tree:

1. **Spine.** The current policy answers the question through the step protocol (plan → search → answer → ... →
   final), exactly as `agent.loop.StepAgent` does: the same prompts (`agent.protocol`), the same parse rules, the
   same fallbacks (a malformed plan goes to the final step; a malformed answer keeps its untagged text), the same
   batched search per KB. Every state it visits (before a plan, an answer or the final step) is an **anchor state**.
2. **Siblings.** From each anchor, G continuations of that one step are sampled from the same prompt (so they share
   the prefix token for token, and all their variance sits in one decision, as in Slate).
3. **Outcome.** Each sibling is then continued by the policy to its final answer (a *continued rollout*), or for at
   most `lookahead` more searches before the final step is forced (a *bounded look-ahead*). Its outcome is the final
   answer's accuracy, discounted by `discount ** d`, d = the steps generated after the sibling's own step.
   Cost: a tree of A anchors generates A·G sibling steps plus up to A·G·(remaining steps) continuation steps, against
   the spine's A; `TreeStats` counts both.

Evidence only ever appears inside answer-step *prompts* (the protocol renders each step as a fresh prompt), so no
retrieved token is ever part of a completion and none carries loss.

Generation is a callable, `generate(prompts, n) -> [Generated]` (n samples per prompt, grouped by prompt), so the
trainer can route it through TRL's own generation (transformers, or vLLM colocate/server), and the same tree code
runs everywhere. It is called once per tree level on every process, even with no prompts, because vLLM generation
gathers across processes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace

from agent.kbs import KnowledgeBase
from agent.protocol import (
    PromptSettings,
    answer_messages,
    check_focus_mode,
    final_messages,
    parse_answer,
    parse_plan,
    plan_messages,
    strip_tags,
)
from retrievers.types import Hit, Query

logger = logging.getLogger(__name__)

PLAN, ANSWER, FINAL = "plan", "answer", "final"


@dataclass(frozen=True)
class OnlineSettings:
    """`online_rollout` of a Step-GRPO recipe with `online: true` (validated when the recipe loads)."""

    kb: str = field(default="", metadata={"help": "KB YAML the rollouts search (local indexes or `remote:` service)."})
    max_steps: int = field(default=2, metadata={"help": "searches before the final answer is forced"})
    top_k: int = field(default=3, metadata={"help": "hits shown per search"})
    discount: float = field(default=0.9, metadata={"help": "γ: the outcome reaches a step d steps earlier as γ^d"})
    outcome_weight: float = field(default=1.0, metadata={"help": "weight of the discounted outcome term"})
    lookahead: int | None = field(
        default=None, metadata={"help": "None: continue each sibling to its end; L: at most L more searches"}
    )
    allow_outcome_only: bool = field(
        default=False,
        metadata={"help": "questions without gold steps train on the outcome (and final accuracy) alone"},
    )
    few_shot: bool = False
    evidence_chars: int = 300
    evidence_focus: str = "head"  # which longer hits show their parts nearest the sub-question (agent.evidence_focus)
    require_think: bool = True
    collapse_window: int = field(default=5, metadata={"help": "warn when the signs below last this many steps"})
    collapse_zero_std: float = field(default=0.9, metadata={"help": "share of zero-std sibling groups that warns"})
    collapse_tag_violation: float = field(default=0.5, metadata={"help": "tag-violation rate that warns"})

    def __post_init__(self) -> None:
        from retrievers.config import check_field_types

        check_field_types(self, "online_rollout.")
        if not self.kb:
            raise ValueError("`online_rollout.kb` is required with `online: true`: e.g. `kb: configs/kb/demo.yaml`")
        if self.max_steps < 1 or self.top_k < 1 or self.evidence_chars < 1:
            raise ValueError(
                f"online_rollout: max_steps, top_k and evidence_chars must be >= 1; got {self.max_steps}, "
                f"{self.top_k} and {self.evidence_chars}"
            )
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"online_rollout.discount must be in [0, 1], got {self.discount}; e.g. `discount: 0.9`")
        if not self.outcome_weight >= 0:
            raise ValueError(f"online_rollout.outcome_weight must be >= 0, got {self.outcome_weight}")
        if self.lookahead is not None and self.lookahead < 0:
            raise ValueError(
                f"online_rollout.lookahead must be >= 0 or null (continue to the end), got {self.lookahead}"
            )
        check_focus_mode(self.evidence_focus, "online_rollout.evidence_focus")
        if self.collapse_window < 1:
            raise ValueError(f"online_rollout.collapse_window must be >= 1, got {self.collapse_window}")

    @classmethod
    def from_dict(cls, d: dict | None) -> OnlineSettings:
        d = dict(d or {})
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - valid)
        if unknown:
            raise ValueError(f"unknown `online_rollout` keys {unknown}; valid: {sorted(valid)}")
        return cls(**d)

    @property
    def prompt_settings(self) -> PromptSettings:
        return PromptSettings(
            few_shot=self.few_shot, evidence_chars=self.evidence_chars, evidence_focus=self.evidence_focus
        )

    @property
    def levels(self) -> int:
        """Steps of the longest trajectory: a plan and an answer per search, then the final step."""
        return 2 * self.max_steps + 1


@dataclass(frozen=True)
class GoldStep:
    """One search of a gold trajectory: its sub-question, KB (display name) and intermediate answer."""

    sub_question: str
    kb: str
    answer: str = ""


@dataclass(frozen=True)
class OnlineQuestion:
    """A training question: gold final answers and, when known, the gold steps (None: outcome only)."""

    id: str
    question: str
    answers: tuple[str, ...]
    images: tuple[str, ...] = ()
    gold_steps: tuple[GoldStep, ...] | None = None


@dataclass(frozen=True)
class StepState:
    """A live prefix: everything that decides the prompt of the next step, plus where the trajectory may go."""

    q: int  # index of the question in the batch
    phase: str  # plan | answer | final
    history: tuple[tuple[str, str], ...] = ()  # (sub_question, answer) of the searches so far
    sub_question: str = ""  # answer phase: what was asked
    kb: str = ""  # answer phase: the KB (display name) searched
    hits: tuple[Hit, ...] = ()  # answer phase: the evidence
    limit: int = 0  # searches allowed in this trajectory (max_steps, or fewer under a bounded look-ahead)

    @property
    def searches(self) -> int:
        return len(self.history)


@dataclass(frozen=True)
class Generated:
    """One sampled step: token ids of the prompt and the completion, its text, and sampling log-probs if known."""

    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    logprobs: list[float] | None = None


# generate(prompts, n) -> len(prompts) * n results, the n samples of each prompt consecutive
GenerateFn = Callable[[list[list[dict]], int], list[Generated]]


class RetrievalFailed(RuntimeError):
    """A search failed during a rollout (e.g. the retrieval service stayed down through its retries)."""


@dataclass
class Sibling:
    """One of the G continuations of an anchor: its own step, then the rest of its trajectory."""

    anchor: StepState
    step: Generated
    state: StepState | None  # where it goes next; None once its final step is done
    steps_after: int = 0
    final_text: str = ""  # the final step's output (its own, for a final-step sibling)
    outcome: float = 0.0


@dataclass
class TreeStats:
    spine_steps: int = 0
    branch_steps: int = 0  # sibling steps + their continuations
    retrieval_calls: int = 0  # queries sent to the KBs
    spine_s: float = 0.0
    branch_s: float = 0.0
    retrieval_s: float = 0.0


@dataclass
class StepTree:
    """The anchors of a batch's spines, in spine order per question, and G siblings for each."""

    questions: list[OnlineQuestion]
    anchors: list[StepState]
    anchor_messages: list[list[dict]]
    siblings: list[list[Sibling]]
    stats: TreeStats


def accuracy(final_text: str, answers: Sequence[str], require_think: bool = True) -> float:
    """Outcome of a trajectory: 1 when its final answer is well formed and recalls a gold answer fully."""
    from training.rewards import answer_score

    parsed = parse_answer(final_text, require_think=require_think)
    if not parsed.ok or parsed.answer is None:
        return 0.0
    return answer_score(parsed.answer, list(answers), rule="accuracy")


class StepTreeRollout:
    """Builds step trees over a set of KBs with a generation function (see the module docstring)."""

    def __init__(self, generate: GenerateFn, kbs: dict[str, KnowledgeBase], settings: OnlineSettings) -> None:
        self.generate = generate
        self.kbs = kbs
        self.settings = settings
        self.kb_menu = [(kb.display_name, kb.description) for kb in kbs.values()]
        self.names = list(kbs)

    # -- rendering and transitions (agent/loop.py's rules) --------------------------------------------------------
    def messages(self, state: StepState, q: OnlineQuestion) -> list[dict]:
        ps = self.settings.prompt_settings
        if state.phase == PLAN:
            return plan_messages(q.question, list(state.history), self.kb_menu, q.images, ps)
        if state.phase == ANSWER:
            return answer_messages(state.sub_question, list(state.hits), q.images, ps)
        return final_messages(q.question, list(state.history), q.images, ps)

    def _after_answer(self, state: StepState, text: str) -> StepState:
        parsed = parse_answer(text, require_think=self.settings.require_think)
        answer = parsed.answer if parsed.ok else (parsed.answer or strip_tags(text))
        history = (*state.history, (state.sub_question, answer))
        phase = PLAN if len(history) < state.limit else FINAL
        return StepState(state.q, phase, history, limit=state.limit)

    def step(self, states: list[StepState], texts: list[str], questions: list[OnlineQuestion],
             stats: TreeStats) -> list[StepState | None]:  # fmt: skip
        """The next state of each state after its step's output (None after the final step); searches batched."""
        out: list[StepState | None] = [None] * len(states)
        searches: list[tuple[int, str, str]] = []  # (index, display name, sub-question)
        for i, (s, text) in enumerate(zip(states, texts, strict=True)):
            if s.phase == FINAL:
                continue
            if s.phase == ANSWER:
                out[i] = self._after_answer(s, text)
                continue
            plan = parse_plan(text, self.names, require_think=self.settings.require_think)
            if not plan.ok or plan.stop:  # a malformed plan ends the searching, as in the agent loop
                out[i] = StepState(s.q, FINAL, s.history, limit=s.limit)
            else:
                searches.append((i, plan.kb, plan.sub_question))
        for (i, kb, sq), hits in zip(searches, self._search(searches, states, questions, stats), strict=True):
            out[i] = StepState(states[i].q, ANSWER, states[i].history, sq, kb, tuple(hits), states[i].limit)
        return out

    def _search(self, searches: list[tuple[int, str, str]], states: list[StepState],
                questions: list[OnlineQuestion], stats: TreeStats) -> list[list[Hit]]:  # fmt: skip
        t0 = time.perf_counter()
        by_kb: dict[str, list[int]] = {}
        for j, (_, kb, _) in enumerate(searches):
            by_kb.setdefault(kb, []).append(j)
        results: list[list[Hit]] = [[] for _ in searches]
        for display, idx in by_kb.items():
            kb = self.kbs[display]
            queries = []
            for j in idx:
                q = questions[states[searches[j][0]].q]
                queries.append(Query(text=searches[j][2], image=next(iter(q.images), None)))
            k = min(self.settings.top_k, kb.k) if kb.k else self.settings.top_k
            try:
                found = kb.retriever.search(queries, k)
            except Exception as e:  # a reward computed without the evidence would be a lie: stop, never score 0
                raise RetrievalFailed(f"search on KB {kb.name!r} failed during a rollout: {e}") from e
            stats.retrieval_calls += len(queries)
            for j, hits in zip(idx, found, strict=True):
                results[j] = list(hits)
        stats.retrieval_s += time.perf_counter() - t0
        return results

    # -- the tree -------------------------------------------------------------------------------------------------
    def _level(self, states: list[StepState], questions: list[OnlineQuestion], n: int) -> list[Generated]:
        msgs = [self.messages(s, questions[s.q]) for s in states]
        outs = self.generate(msgs, n)
        if len(outs) != len(msgs) * n:
            raise RuntimeError(f"generation returned {len(outs)} completions for {len(msgs)} prompts x {n}")
        return outs

    def build(self, questions: list[OnlineQuestion], num_generations: int) -> StepTree:
        """Spine rollouts of `questions`, then `num_generations` siblings at every anchor, each run to its outcome."""
        s = self.settings
        stats = TreeStats()
        t0 = time.perf_counter()
        anchors: list[list[StepState]] = [[] for _ in questions]
        live = [StepState(i, PLAN, limit=s.max_steps) for i in range(len(questions))]
        for _ in range(s.levels):  # fixed count: generation may be collective across processes
            outs = self._level(live, questions, 1)
            for st in live:
                anchors[st.q].append(st)
            stats.spine_steps += len(live)
            live = [n for n in self.step(live, [o.text for o in outs], questions, stats) if n is not None]
        if live:
            raise RuntimeError(f"spine rollouts did not finish within {s.levels} steps")
        stats.spine_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        flat = [a for per_q in anchors for a in per_q]
        siblings = self._branch(flat, questions, num_generations, stats)
        stats.branch_s = time.perf_counter() - t0
        messages = [self.messages(a, questions[a.q]) for a in flat]
        return StepTree(questions, flat, messages, siblings, stats)

    def _branch(self, anchors: list[StepState], questions: list[OnlineQuestion], g: int,
                stats: TreeStats) -> list[list[Sibling]]:  # fmt: skip
        s = self.settings
        outs = self._level(anchors, questions, g)
        stats.branch_steps += len(outs)
        reps = [a for a in anchors for _ in range(g)]
        nexts = self.step(reps, [o.text for o in outs], questions, stats)
        sibs = []
        for a, o, nxt in zip(reps, outs, nexts, strict=True):
            if nxt is not None and s.lookahead is not None:  # bounded look-ahead: fewer searches after this step
                done = nxt.searches + (1 if nxt.phase == ANSWER else 0)  # an answer phase finishes a search
                nxt = replace(nxt, limit=min(a.limit, done + s.lookahead))
                if nxt.phase == PLAN and nxt.searches >= nxt.limit:
                    nxt = replace(nxt, phase=FINAL)
            sibs.append(Sibling(a, o, nxt, final_text=o.text if a.phase == FINAL else ""))
        for _ in range(s.levels):  # continue every sibling to its final answer, in lockstep
            running = [sb for sb in sibs if sb.state is not None]
            outs = self._level([sb.state for sb in running], questions, 1)
            stats.branch_steps += len(outs)
            nexts = self.step([sb.state for sb in running], [o.text for o in outs], questions, stats)
            for sb, o, nxt in zip(running, outs, nexts, strict=True):
                sb.steps_after += 1
                if sb.state.phase == FINAL:
                    sb.final_text = o.text
                sb.state = nxt
        if any(sb.state is not None for sb in sibs):
            raise RuntimeError(f"sibling continuations did not finish within {s.levels} steps")
        for sb in sibs:
            sb.outcome = accuracy(sb.final_text, questions[sb.anchor.q].answers, s.require_think)
        return [sibs[i * g : (i + 1) * g] for i in range(len(anchors))]
