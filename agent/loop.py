"""The step loop. All active trajectories of a batch advance together (lockstep): one batched generation for all
plan steps, one batched search per KB, one batched generation for all answer steps, then one for the final step.

Malformed model output never escapes as an exception: it is re-asked a bounded number of times, then recorded
in the step's `format_errors` and the trajectory's `stop_reason`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from agent.backends.base import (
    BackendError,
    Completion,
    Message,
    Policy,
    SamplingParams,
    last_user_text,
    row_params,
    supports_grammar,
)
from agent.kbs import KnowledgeBase
from agent.metrics import normalize_answer, token_f1
from agent.protocol import (
    DEFAULT_PROMPT,
    AnswerParse,
    PlanParse,
    PromptSettings,
    add_evidence_images,
    answer_grammar,
    answer_messages,
    check_answer_words,
    check_focus_mode,
    final_messages,
    parse_answer,
    parse_plan,
    plan_grammar,
    plan_messages,
    ret_choice,
    ret_prefix,
    shown_answer_grammars,
    shown_words,
    strip_tags,
    with_format_reminder,
)
from agent.routing import AUTO_WEIGHT, CONTENT_ONLY, SIZE_PRIOR, RoutePrior, normalized
from agent.types import Question, Step, Trajectory
from retrievers.types import Hit, Query

logger = logging.getLogger(__name__)

# on_event(trajectory_id, event, payload): event is "plan" | "evidence" | "answer" | "final"
EventCallback = Callable[[str, str, dict], None]


CONSTRAINED = ("auto", "on", "off")


def use_constrained(mode: str, policy: Policy) -> bool:
    """Resolve `agent.constrained` for a policy; `on` with a backend that cannot enforce a grammar is an error."""
    if mode == "off":
        return False
    if supports_grammar(policy):
        return True
    if mode == "on":
        raise ValueError(
            f"agent.constrained is 'on' but policy {getattr(policy, 'name', policy)!r} "
            f"({type(policy).__name__}) has no structured output. Fix: use the transformers, vl or vllm backend, or an "
            "openai server with policy.grammar_field vllm | sglang | llamacpp; or set agent.constrained: auto or off"
        )
    return False


def make_route_prior(config: AgentConfig, policy: Policy, kbs: dict[str, KnowledgeBase]) -> RoutePrior | None:
    """The agent's route prior, or None when `agent.route_prior` is 0 (or auto with a policy that cannot score KB
    names); a weight > 0 with such a policy fails here."""
    can_score = bool(getattr(policy, "supports_continuation_scoring", False))
    weight = config.route_prior
    if weight is None:  # auto
        trained = getattr(policy, "trained_kb_names", None)
        unknown = sorted(set(kbs) - trained) if trained is not None else []
        if unknown:  # its log-probs know other names: route by content (agent/routing.py, docs/stop40/)
            logger.info(
                "route prior: the router was not trained on the KB names %s; each search goes to the KB whose docs are "
                "closest to its sub-question (set agent.route_prior to a weight to fuse its own choice back in)",
                unknown,
            )
            return RoutePrior(kbs, CONTENT_ONLY, config.route_prior_encoder, config.route_prior_size)
        weight = AUTO_WEIGHT if can_score else 0.0
    if weight == 0:
        return None
    if not can_score:
        raise ValueError(
            f"agent.route_prior is {config.route_prior} but policy {getattr(policy, 'name', policy)!r} "
            f"({type(policy).__name__}) cannot score the KB names it did not write. Fix: use the transformers, vl or "
            "vllm backend, or openai against a vLLM-compatible server (policy.grammar_field: vllm, which `kbrouter "
            "serve` is); or set agent.route_prior: 0"
        )
    return RoutePrior(kbs, weight, config.route_prior_encoder, config.route_prior_size)


@dataclass(frozen=True)
class AgentConfig:
    """Settings of the step loop."""

    max_steps: int = field(default=3, metadata={"help": "retrieval steps before the final answer (paper: n = 3)"})
    top_k: int = field(default=5, metadata={"help": "hits shown to the policy per retrieval"})
    min_steps: int = field(
        default=0,
        metadata={
            "help": "searches before the stop plan is allowed (constrained decoding drops its None branch until then)"
        },
    )
    max_retries: int = field(default=1, metadata={"help": "re-asks after a malformed reply, per step"})
    # Token budgets per step. Constrained steps size their grammar to close within them (an early end-of-sequence
    # makes the usual step far shorter, so a generous budget costs nothing); unconstrained steps stop at the tag.
    # The grammar bounds each field at 2 tokens a character (worst case), so a budget buys half as many characters:
    # at 448/256/256 a final step's <think> got 55 characters and cut the shipped router's answers mid-word
    # ("Casuarina" -> "Casuarë"); 640/512/512 leave the greedy output of 61 of 62 sampled scoreboard steps as free
    # decoding writes it (24/31 plan, 25/31 final at 448/256).
    plan_tokens: int = 640
    answer_tokens: int = 512
    final_tokens: int = 512
    constrained: str = field(
        default="auto",
        metadata={
            "help": "decode inside the step grammar: on | off | auto (on where the backend has structured output)"
        },
    )
    answer_words: str = field(
        default="free",
        metadata={
            "help": "what a constrained answer or final step may write in <answer>: free (any text) | shown (words "
            "of the prompt it read, yes/no and numbers: it cannot invent a name the evidence does not hold) | found "
            "(as shown, but a final answer takes the words of the intermediate answers)"
        },
    )
    reuse_answer: bool = field(
        default=False,
        metadata={
            "help": "end a trajectory whose only search asked the original question itself (the same words once "
            "normalized) with that search's answer, without a final step: that step would be asked the same "
            "question again, from no new evidence. Off, the final step always runs (training rollouts train it)"
        },
    )
    answer_samples: int = field(
        default=1,
        metadata={
            "help": "answers decoded for each answer and final step: the first as configured, the rest sampled at "
            "answer_temperature; the step keeps the well-formed answer that agrees most with the others (summed "
            "token F1: self-consistency for free-form answers). 1 = one answer, no vote"
        },
    )
    answer_temperature: float = field(default=0.7, metadata={"help": "sampling temperature of the extra answers"})
    temperature: float = 0.0
    top_p: float = 1.0
    top_k_sampling: int = 0
    seed: int | None = None
    require_think: bool = field(default=True, metadata={"help": "a missing <think> is a format error"})
    few_shot: bool = field(
        default=DEFAULT_PROMPT.few_shot,
        metadata={"help": "show a worked example before each step (untrained policies)"},
    )
    evidence_chars: int = field(default=DEFAULT_PROMPT.evidence_chars, metadata={"help": "longest evidence per hit"})
    evidence_focus: str = field(
        default=DEFAULT_PROMPT.evidence_focus,
        metadata={
            "help": "which hits longer than evidence_chars show their rows or sentences nearest the sub-question "
            "(agent/protocol/evidence.py) rather than their head: head (none) | tables | all"
        },
    )
    evidence_images: int = field(
        default=0,
        metadata={"help": "images/frames behind the hits shown to a VL policy in the answer step (0 = none)"},
    )
    route_prior: float | None = field(
        default=0.0,
        metadata={
            "help": "weight w of the evidence-aware route prior (agent/routing.py): a search goes to the KB "
            "maximising log p_policy(KB) + w * (affinity - best affinity), the affinity being the best cosine of the "
            "sub-question with the KB's docs; 0 = the policy routes alone; null = auto (the weight chosen in stop 38 "
            "where the policy can score KB names (transformers, vl, vllm; openai with grammar_field vllm), else 0; what `kbrouter demo | ask | run` use)"
        },
    )
    route_prior_encoder: str = field(default="minilm", metadata={"help": "text encoder of the route prior"})
    route_prior_size: float = field(
        default=SIZE_PRIOR,
        metadata={
            "help": "s of the affinity's size term, s * sqrt(2 ln n) off a KB of n docs, so a big KB does not win "
            "questions that name no content of any KB (agent/routing.py); 0 = the raw largest cosine"
        },
    )
    retry_temperature: float = field(
        default=0.0,
        metadata={
            "help": "sampling temperature of re-asks (0 = as the first ask); a greedy re-ask often "
            "repeats its reply, but sampling did not help SmolLM2-135M on the demo"
        },
    )

    def __post_init__(self) -> None:
        from retrievers.config import check_field_types

        check_focus_mode(self.evidence_focus, "agent.evidence_focus")  # first: YAML reads `on` as true, not a mode
        check_answer_words(self.answer_words)
        check_field_types(self, "agent.")
        for key in ("plan_tokens", "answer_tokens", "final_tokens", "evidence_chars"):
            if getattr(self, key) < 1:
                raise ValueError(f"agent.{key} must be >= 1, got {getattr(self, key)}")
        if self.temperature < 0 or self.retry_temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"need agent.temperature, agent.retry_temperature >= 0 and 0 < agent.top_p <= 1; got "
                f"{self.temperature}, {self.retry_temperature} and {self.top_p}"
            )
        if self.answer_samples < 1 or not 0 < self.answer_temperature < float("inf"):
            raise ValueError(
                f"need agent.answer_samples >= 1 and a finite agent.answer_temperature > 0; got "
                f"{self.answer_samples} and {self.answer_temperature}"
            )
        if self.top_k_sampling < 0 or self.evidence_images < 0:
            raise ValueError(
                f"agent.top_k_sampling and agent.evidence_images must be >= 0, got {self.top_k_sampling} and "
                f"{self.evidence_images}"
            )
        if self.max_steps < 0:
            raise ValueError(f"max_steps must be >= 0, got {self.max_steps}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if not 0 <= self.min_steps <= max(self.max_steps, 0):
            raise ValueError(f"min_steps must be in [0, max_steps={self.max_steps}], got {self.min_steps}")
        if self.route_prior is not None and (not self.route_prior >= 0 or self.route_prior == float("inf")):
            raise ValueError(f"agent.route_prior must be a finite weight >= 0 (0 = off), got {self.route_prior}")
        if not 0 <= self.route_prior_size < float("inf"):
            raise ValueError(
                f"agent.route_prior_size must be a finite number >= 0 (0 = no size term), got {self.route_prior_size}"
            )
        if self.constrained not in CONSTRAINED:
            raise ValueError(f"agent.constrained must be one of {CONSTRAINED}, got {self.constrained!r}")

    @property
    def prompt_settings(self) -> PromptSettings:
        return PromptSettings(
            few_shot=self.few_shot, evidence_chars=self.evidence_chars, evidence_focus=self.evidence_focus
        )

    def sampling(
        self,
        max_new_tokens: int,
        stop: tuple[str, ...],
        salt: int = 0,
        grammar: str | tuple[str, ...] | None = None,
        step: str | None = None,
    ) -> SamplingParams:
        seed = None if self.seed is None else self.seed + salt
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k_sampling,
            seed=seed,
            stop=() if grammar else stop,
            grammar=grammar,
            step=step,
        )


@dataclass
class _State:
    """Mutable bookkeeping of one trajectory while the batch runs."""

    q: Question
    steps: list[Step] = field(default_factory=list)
    planning: bool = True
    stop_reason: str = "answered"
    error: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def history(self) -> list[tuple[str, str]]:
        return [(s.sub_question, s.answer) for s in self.steps if s.sub_question is not None]


class StepAgent:
    """Runs questions through the step protocol with one policy over a set of KBs (keyed by display name)."""

    def __init__(self, policy: Policy, kbs: dict[str, KnowledgeBase], config: AgentConfig | None = None) -> None:
        self.policy = policy
        self.kbs = kbs
        self.config = config or AgentConfig()
        self.constrained = use_constrained(self.config.constrained, policy)  # fails here, before any generation
        if self.config.answer_words != "free" and not self.constrained:
            raise ValueError(
                f"agent.answer_words: {self.config.answer_words} is enforced by the answer grammar, and this agent "
                f"decodes without one (agent.constrained: {self.config.constrained}, policy {policy.name}); set "
                "agent.constrained: on with a backend that has structured output, or agent.answer_words: free"
            )
        self._grammars: dict[str, str] = {}
        if self.constrained:  # built once per KB set; a budget too small for the tags fails here too
            cfg = self.config
            self._grammars = {
                "plan": plan_grammar(tuple(kbs), cfg.plan_tokens).ebnf,
                "plan_must_search": plan_grammar(tuple(kbs), cfg.plan_tokens, allow_stop=False).ebnf,
                "answer": answer_grammar(cfg.answer_tokens).ebnf,
                "final": answer_grammar(cfg.final_tokens).ebnf,
            }

        self.route_prior = make_route_prior(self.config, policy, kbs)  # fails here too, before any generation

    def _params(self, step: str, stop: str, salt: int, step_index: int = 0) -> SamplingParams:
        cfg = self.config
        tokens = {"plan": cfg.plan_tokens, "answer": cfg.answer_tokens, "final": cfg.final_tokens}[step]
        key = "plan_must_search" if step == "plan" and step_index < cfg.min_steps else step
        grammar = self._grammars.get(key)
        return cfg.sampling(tokens, (stop,), salt=salt, grammar=grammar, step=step)

    def _answer_params(
        self, step: str, convs: list[list[Message]], salt: int, states: Sequence[_State] = ()
    ) -> SamplingParams:
        """An answer or final step's params. Unless `answer_words` is free, one grammar per conversation, whose answer
        is made of the words its own prompt shows (evidence labels such as `wiki-0` left out); with `found`, a final
        step's are the words of its intermediate answers (of its prompt when they have none)."""
        params = self._params(step, "</answer>", salt=salt)
        if not self.constrained or self.config.answer_words == "free":
            return params
        tokens = self.config.answer_tokens if step == "answer" else self.config.final_tokens
        labels = [kb.name for kb in self.kbs.values()]
        texts = [last_user_text(c) for c in convs]
        bounds: list[int | None] = []
        if step == "final" and self.config.answer_words == "found":
            found = [" ".join(a for _, a in s.history) for s in states]
            from_answers = [bool(shown_words(f, labels)) for f in found]
            texts = [f if use else t for f, t, use in zip(found, texts, from_answers, strict=True)]
            # a final built from the intermediate answers is no longer than they are: it cannot loop through them
            bounds = [len(f.split()) if use else None for f, use in zip(found, from_answers, strict=True)]
        return replace(params, grammar=shown_answer_grammars(texts, tokens, labels, bounds))

    @property
    def render_settings(self) -> dict:
        """How this agent renders and decodes steps; stored in every trajectory's metadata (`answer_words` only
        where it is not free, `reuse_answer` where it is on and the vote where there is one, so records written
        before them read the same)."""
        words = {} if self.config.answer_words == "free" else {"answer_words": self.config.answer_words}
        reuse = {"reuse_answer": True} if self.config.reuse_answer else {}
        votes = {} if self.config.answer_samples == 1 else {
            "answer_samples": self.config.answer_samples, "answer_temperature": self.config.answer_temperature
        }  # fmt: skip
        return {**self.config.prompt_settings.to_dict(), "constrained": self.constrained, **words, **reuse, **votes}

    # -- generation with bounded re-asking -------------------------------------------------------------------
    def _generate(
        self,
        states: list[_State],
        convs: list[list[Message]],
        parse: Callable[[str], PlanParse | AnswerParse],
        params: SamplingParams,
    ) -> list[tuple[PlanParse | AnswerParse | None, list[str]]]:
        """Generate, re-asking the malformed ones; returns (last parse or None on backend error, raw outputs)."""
        results: list[tuple[PlanParse | AnswerParse | None, list[str]]] = [(None, []) for _ in states]
        pending = list(range(len(states)))
        convs = list(convs)
        for attempt in range(self.config.max_retries + 1):
            if not pending:
                break
            if attempt > 0 and self.config.retry_temperature > params.temperature:
                seed = None if params.seed is None else params.seed + 1000 * attempt
                params = replace(params, temperature=self.config.retry_temperature, seed=seed)
            try:
                outs: list[Completion] = self.policy.generate([convs[i] for i in pending], row_params(params, pending))
            except BackendError as e:
                for i in pending:
                    states[i].stop_reason, states[i].error = "backend_error", str(e)
                return results
            retry = []
            for i, out in zip(pending, outs, strict=True):
                states[i].prompt_tokens += out.prompt_tokens
                states[i].completion_tokens += out.completion_tokens
                raw = [*results[i][1], out.text]
                if out.finish_reason == "error":
                    states[i].stop_reason, states[i].error = "backend_error", out.metadata.get("error", "")
                    results[i] = (None, raw)
                    continue
                parsed = parse(out.text)
                results[i] = (parsed, raw)
                if not parsed.ok and attempt < self.config.max_retries:
                    convs[i] = with_format_reminder(convs[i], out.text, parsed.errors)
                    retry.append(i)
            pending = retry
        return results

    def _vote(
        self,
        states: list[_State],
        convs: list[list[Message]],
        parse: Callable[[str], PlanParse | AnswerParse],
        params: SamplingParams,
        results: list[tuple[PlanParse | AnswerParse | None, list[str]]],
    ) -> dict[int, dict]:
        """Self-consistency for answer and final steps (`agent.answer_samples` n > 1). Decodes n - 1 more answers per
        conversation in one call at `answer_temperature`, then keeps, among the well-formed non-empty ones (the first
        decode included), the answer with the highest summed token F1 against the others: the minimum-Bayes-risk
        pick, which for short answers is the majority. Ties keep the earliest, so the first decode stays unless others
        agree elsewhere. Replaces the kept one's parse and last raw output in `results`, in place; returns, by
        position, what each voted step records. A backend error in the extra call keeps the first decodes."""
        n = self.config.answer_samples
        todo = [i for i, (parsed, _) in enumerate(results) if parsed is not None]
        if n == 1 or not todo:
            return {}
        rows = [i for i in todo for _ in range(n - 1)]
        seed = None if params.seed is None else params.seed + 7919
        sampled = replace(row_params(params, rows), temperature=self.config.answer_temperature, seed=seed)
        try:
            outs = self.policy.generate([convs[i] for i in rows], sampled)
        except BackendError as e:
            logger.warning("answer_samples: the extra answers failed (%s); the first decodes stand", e)
            return {}
        extra: dict[int, list[tuple[PlanParse | AnswerParse, str]]] = {i: [] for i in todo}
        for i, out in zip(rows, outs, strict=True):
            states[i].prompt_tokens += out.prompt_tokens
            states[i].completion_tokens += out.completion_tokens
            if out.finish_reason != "error":
                extra[i].append((parse(out.text), out.text))
        votes = {}
        for i in todo:
            first, raw = results[i]
            assert first is not None
            candidates = [(first, raw[-1]), *extra[i]]
            answers = [p.answer if isinstance(p, AnswerParse) and p.ok and p.answer.strip() else None
                       for p, _ in candidates]  # fmt: skip
            agreement = [
                None if a is None else sum(token_f1(a, b) for k, b in enumerate(answers) if k != j and b is not None)
                for j, a in enumerate(answers)
            ]
            scored = [j for j, a in enumerate(agreement) if a is not None]
            if scored:
                best = max(scored, key=lambda j: (agreement[j], -j))
                results[i] = (candidates[best][0], [*raw[:-1], candidates[best][1]])
                votes[i] = {"answers": answers, "agreement": agreement, "kept": best}
        return votes

    def _answer_messages(self, sub_question: str, hits: list[Hit], images: tuple[str, ...]) -> list[Message]:
        msgs = answer_messages(sub_question, hits, images, self.config.prompt_settings)
        if self.config.evidence_images:  # pixels only matter to VL policies
            msgs = add_evidence_images(msgs, hits, max_images=self.config.evidence_images)
        return msgs

    def _emit(self, on_event: EventCallback | None, sid: str, event: str, payload: dict) -> None:
        if on_event is not None:
            on_event(sid, event, payload)

    # -- one batch in lockstep ---------------------------------------------------------------------------------
    def run_batch(self, questions: Sequence[Question], on_event: EventCallback | None = None) -> list[Trajectory]:
        """Answer all questions together; returns one trajectory per question, in order."""
        cfg = self.config
        states = [_State(q) for q in questions]
        kb_menu = [(kb.display_name, kb.description) for kb in self.kbs.values()]
        names = list(self.kbs)
        for step_i in range(cfg.max_steps):
            active = [s for s in states if s.planning and s.stop_reason != "backend_error"]
            if not active:
                break
            # 1. plan, batched
            t0 = time.perf_counter()
            convs = [plan_messages(s.q.question, s.history, kb_menu, s.q.images, cfg.prompt_settings) for s in active]
            plans = self._generate(
                active,
                convs,
                lambda text: parse_plan(text, names, require_think=cfg.require_think),
                self._params("plan", "</ret>", salt=10 * step_i, step_index=step_i),
            )
            routes = self._route(convs, plans) if self.route_prior else {}
            plan_s = time.perf_counter() - t0
            to_retrieve: list[tuple[_State, PlanParse, list[str]]] = []
            route_of: dict[int, dict] = {}
            for i, (s, (parsed, raw)) in enumerate(zip(active, plans, strict=True)):
                if parsed is None:  # backend error
                    s.planning = False
                    continue
                assert isinstance(parsed, PlanParse)
                timings = {"plan_s": plan_s}
                if not parsed.ok:
                    s.steps.append(
                        Step(
                            index=step_i,
                            think=parsed.think or "",
                            raw=tuple(raw),
                            format_errors=parsed.errors,
                            timings=timings,
                        )
                    )
                    s.planning, s.stop_reason = False, "format_error"
                elif parsed.stop:
                    s.steps.append(Step(index=step_i, think=parsed.think or "", raw=tuple(raw), timings=timings))
                    s.planning = False
                else:
                    to_retrieve.append((s, parsed, raw))
                    route_of[id(s)] = routes.get(i, {})
                self._emit(
                    on_event,
                    s.q.id,
                    "plan",
                    {
                        "step": step_i,
                        "think": parsed.think,
                        "sub_question": parsed.sub_question,
                        "kb": parsed.kb,
                        "errors": list(parsed.errors),
                        **({"route": routes[i]} if i in routes else {}),
                    },
                )
            if not to_retrieve:
                continue
            # 2. retrieve, one batched search per KB
            t0 = time.perf_counter()
            hits = self._retrieve(to_retrieve)
            retrieve_s = time.perf_counter() - t0
            for (s, parsed, _), h in zip(to_retrieve, hits, strict=True):
                # with the rendering, so a display can show a focused hit's rows as the answer step reads them
                render = {
                    "sub_question": parsed.sub_question,
                    "focus": cfg.evidence_focus,
                    "chars": cfg.evidence_chars,
                }
                self._emit(on_event, s.q.id, "evidence", {"step": step_i, "kb": parsed.kb, "hits": h, **render})
            # 3. answer, batched
            ok = [
                (s, p, raw, h)
                for (s, p, raw), h in zip(to_retrieve, hits, strict=True)
                if s.stop_reason != "backend_error"
            ]
            t0 = time.perf_counter()
            convs = [self._answer_messages(p.sub_question, h, s.q.images) for s, p, _, h in ok]
            answer_parse = lambda text: parse_answer(text, require_think=cfg.require_think)  # noqa: E731
            answer_params = self._answer_params("answer", convs, salt=10 * step_i + 1)
            answers = self._generate([s for s, *_ in ok], convs, answer_parse, answer_params)
            votes = self._vote([s for s, *_ in ok], convs, answer_parse, answer_params, answers)
            answer_s = time.perf_counter() - t0
            for j, ((s, p, raw, h), (parsed, araw)) in enumerate(zip(ok, answers, strict=True)):
                if parsed is None:
                    s.planning = False
                    continue
                assert isinstance(parsed, AnswerParse)
                answer = parsed.answer if parsed.ok else (parsed.answer or strip_tags(araw[-1]))
                s.steps.append(
                    Step(
                        index=step_i,
                        think=p.think or "",
                        sub_question=p.sub_question,
                        kb=self.kbs[p.kb].name,
                        hits=tuple(h),
                        answer_think=parsed.think or "",
                        answer=answer,
                        raw=tuple(raw + araw),
                        format_errors=parsed.errors,
                        timings={"plan_s": plan_s, "retrieve_s": retrieve_s, "answer_s": answer_s},
                        route=route_of.get(id(s), {}),
                        votes=votes.get(j, {}),
                    )
                )
                voted = {"votes": votes[j]} if j in votes else {}
                self._emit(
                    on_event,
                    s.q.id,
                    "answer",
                    {"step": step_i, "answer": answer, "errors": list(parsed.errors), **voted},
                )
        for s in states:
            if s.planning and s.stop_reason == "answered":
                s.stop_reason = "max_steps"
        return self._finish(states, on_event)

    def _route(
        self, convs: list[list[Message]], plans: list[tuple[PlanParse | AnswerParse | None, list[str]]]
    ) -> dict[int, dict]:
        """Re-pick each search's KB with the route prior (`agent.routing`), in place in `plans`; returns, by position,
        what each routed step records. The policy's log-probabilities are read after its own plan text up to `<ret>`,
        on the step's first conversation (a re-asked step's reminder turn is not in it), and only for the plans whose
        KB the affinity contests (`RoutePrior.contested`): the others keep their KB at no cost."""
        prior = self.route_prior
        assert prior is not None
        todo = [
            i
            for i, (parsed, raw) in enumerate(plans)
            if isinstance(parsed, PlanParse) and parsed.ok and not parsed.stop and ret_prefix(raw[-1]) is not None
        ]
        if not todo:  # every plan stopped or failed
            return {}
        affinities = dict(zip(todo, prior.affinity([plans[i][0].sub_question for i in todo]), strict=True))  # type: ignore[union-attr]
        picks = {i: plans[i][0].kb for i in todo}  # type: ignore[union-attr]
        contested = [i for i in todo if prior.contested(picks[i], affinities[i]) and not prior.content_only]
        names = list(self.kbs)
        scores = (
            self.policy.continuation_logprobs(  # type: ignore[attr-defined] - checked in make_route_prior
                [convs[i] for i in contested],
                [ret_prefix(plans[i][1][-1]) for i in contested],
                [ret_choice(n) for n in names],
                step="plan",
            )
            if contested
            else []
        )
        logprobs = {  # None: a remote policy could not score this plan, whose own pick then stands
            i: dict(zip(names, normalized(lp), strict=True))
            for i, lp in zip(contested, scores, strict=True)
            if lp is not None
        }
        out = {}
        for i in todo:
            parsed, raw = plans[i]
            assert isinstance(parsed, PlanParse)
            scored = i in logprobs or prior.content_only  # content only reads no log-probs
            chosen = prior.choose(picks[i], logprobs.get(i, {}), affinities[i]) if scored else picks[i]
            out[i] = prior.describe(logprobs.get(i, {}), affinities[i], picks[i], chosen)
            if chosen != parsed.kb:
                plans[i] = (replace(parsed, kb=chosen), raw)
        return out

    def _retrieve(self, items: list[tuple[_State, PlanParse, list[str]]]) -> list[list[Hit]]:
        by_kb: dict[str, list[int]] = {}
        for i, (_, p, _) in enumerate(items):
            by_kb.setdefault(p.kb, []).append(i)
        out: list[list[Hit]] = [[] for _ in items]
        for display, idx in by_kb.items():
            kb = self.kbs[display]
            queries = [Query(text=items[i][1].sub_question, image=next(iter(items[i][0].q.images), None)) for i in idx]
            try:
                results = kb.retriever.search(queries, min(self.config.top_k, kb.k) if kb.k else self.config.top_k)
            except Exception as e:  # a failing KB ends these trajectories, not the whole batch
                logger.exception("search failed on KB %s", kb.name)
                for i in idx:
                    items[i][0].stop_reason, items[i][0].error = "backend_error", f"{kb.name}: {e}"
                    items[i][0].planning = False
                continue
            for i, r in zip(idx, results, strict=True):
                out[i] = r
        return out

    def _reused_step(self, s: _State) -> Step | None:
        """With `reuse_answer`, the one search whose answer ends `s` without a final step: the trajectory's only
        search, well formed, with an answer, whose sub-question is the question itself once normalized."""
        if not self.config.reuse_answer:
            return None
        searched = [step for step in s.steps if step.sub_question is not None]
        if len(searched) != 1 or searched[0].format_errors or not searched[0].answer.strip():
            return None
        only = searched[0]
        return only if normalize_answer(only.sub_question or "") == normalize_answer(s.q.question) else None

    def _finish(self, states: list[_State], on_event: EventCallback | None) -> list[Trajectory]:
        cfg = self.config
        live = [s for s in states if s.stop_reason != "backend_error"]
        reused = {id(s): step for s in live if (step := self._reused_step(s)) is not None}
        asked = [s for s in live if id(s) not in reused]
        t0 = time.perf_counter()
        convs = [final_messages(s.q.question, s.history, s.q.images, cfg.prompt_settings) for s in asked]
        final_parse = lambda text: parse_answer(text, require_think=cfg.require_think)  # noqa: E731
        final_params = self._answer_params("final", convs, salt=99, states=asked)
        finals = self._generate(asked, convs, final_parse, final_params) if asked else []
        final_votes = self._vote(asked, convs, final_parse, final_params, finals)
        final_s = time.perf_counter() - t0
        by_id = {id(s): f for s, f in zip(asked, finals, strict=True)}
        votes_of = {id(s): final_votes[j] for j, s in enumerate(asked) if j in final_votes}
        out = []
        for s in states:
            parsed, raw = by_id.get(id(s), (None, []))
            think, answer = "", ""
            reuse = reused.get(id(s))
            if reuse is not None:
                answer = reuse.answer
            elif parsed is not None:
                assert isinstance(parsed, AnswerParse)
                think = parsed.think or ""
                answer = parsed.answer if parsed.ok else (parsed.answer or strip_tags(raw[-1]) or parsed.think or "")
                if not parsed.ok and s.stop_reason != "backend_error":
                    s.stop_reason = "format_error"
            meta = {
                **s.q.metadata,
                "model": self.policy.name,
                "render": self.render_settings,
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens,
                "final_s": 0.0 if reuse is not None else final_s,
                "final_errors": list(parsed.errors) if parsed is not None else [],
                **({"final_from_step": reuse.index} if reuse is not None else {}),
                **({"final_votes": votes_of[id(s)]} if id(s) in votes_of else {}),
            }
            if s.error:
                meta["error"] = s.error
            traj = Trajectory(
                id=s.q.id,
                question=s.q.question,
                images=s.q.images,
                steps=tuple(s.steps),
                final_think=think,
                final_answer=answer,
                final_raw=tuple(raw),
                stop_reason=s.stop_reason,
                gold=s.q.answers,
                metadata=meta,
            )
            reused_from = {"from_step": reuse.index} if reuse is not None else {}
            voted = {"votes": votes_of[id(s)]} if id(s) in votes_of else {}
            payload = {"answer": answer, "stop_reason": s.stop_reason, **reused_from, **voted}
            self._emit(on_event, s.q.id, "final", payload)
            out.append(traj)
        return out

    def run(
        self,
        questions: Sequence[Question],
        batch_size: int = 32,
        on_event: EventCallback | None = None,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Answer questions in lockstep batches of `batch_size`; `on_trajectory` sees each finished one."""
        out = []
        for start in range(0, len(questions), batch_size):
            for t in self.run_batch(questions[start : start + batch_size], on_event):
                if on_trajectory is not None:
                    on_trajectory(t)
                out.append(t)
        return out

    def run_sequential(self, questions: Sequence[Question], on_event: EventCallback | None = None) -> list[Trajectory]:
        """One question at a time (interactive use; the throughput baseline)."""
        return [self.run_batch([q], on_event)[0] for q in questions]


def with_metadata(traj: Trajectory, **extra: object) -> Trajectory:
    return replace(traj, metadata={**traj.metadata, **extra})
