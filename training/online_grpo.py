"""Online Step-GRPO on TRL: live step trees through the real KBs, an advantage for every visited step.

`kbrouter train grpo --config configs/train/smollm2_online_grpo_cpu.yaml` (a recipe with `online: true`).

Per generation batch, each question the sampler drew is rolled out by the current policy (`training.rollouts`): every
visited step is an anchor state, G siblings branch from it, and each sibling becomes one training row whose prompt is
the anchor's prompt and whose completion is the sibling's step. TRL then scores the rows with the recipe's step
rewards (`training.rewards`, unchanged: route and ask against the gold step, intermediate-answer F1, final accuracy)
plus `outcome_reward` (the sibling's discounted final accuracy), and normalises advantages over each run of G rows:
exactly the siblings of one anchor state. A row's completion is one step, so its scalar advantage is that step's.

Gold steps are matched by position: the plan after k searches is scored against gold step k (a gold stop when the gold
trajectory had ended), the k-th intermediate answer against gold step k's answer. Questions without gold steps train
on the outcome and the final accuracy alone, when the recipe allows it (`online_rollout.allow_outcome_only`).

Retrieval failing (the service down through its client's retries) stops the run with a checkpoint at the current
global step and a clear error: a reward computed without evidence is never used.
"""

from __future__ import annotations

import collections
import logging
import math
import random
import time
from collections.abc import Sequence
from pathlib import Path

from agent.protocol import parse_answer, parse_plan
from agent.step_records import NamedKB, kb_id
from retrievers.jsonl import iter_jsonl_objects
from retrievers.types import Hit  # noqa: F401 (documented type of the rollout evidence)
from training.config import StepGRPOConfig
from training.rollouts import (
    ANSWER,
    FINAL,
    PLAN,
    Generated,
    GoldStep,
    OnlineQuestion,
    OnlineSettings,
    RetrievalFailed,
    StepState,
    StepTree,
    StepTreeRollout,
)

logger = logging.getLogger(__name__)

STEP_REWARDS = ("ask", "route")  # need a gold step; `answer` also scores final steps, whose gold always exists


# -- questions ------------------------------------------------------------------------------------------------------
def question_from_row(row: dict, kbs: Sequence[NamedKB], where: str) -> OnlineQuestion | None:
    """One training question from a trajectory row (gold steps from its searches) or a question row.

    A question row is `{id, question, answers | golden_answers, gold_steps?: [{sub_question, kb, answer}]}`; a gold
    step's `kb` is a KB name or display name. Gold steps carry display names (what the route reward compares with
    `<ret>`), mapped by `agent.step_records.kb_id` (a trajectory's steps carry names). Trajectories that did not end
    with an answer give None (skipped, as in `training.step_data`).

    Args:
        row: one line of the training file.
        kbs: the online KB set (`agent.kbs.kb_configs` of `online_rollout.kb`).
        where: `path:line` of the row, for errors.
    """
    if "steps" in row and "question" in row:
        from agent.types import Trajectory

        traj = Trajectory.from_dict(row)
        if traj.stop_reason not in ("answered", "max_steps"):
            return None
        answers = tuple(traj.gold or ())
        gold = tuple(GoldStep(s.sub_question, kb_id(s.kb or "", kbs, "display_name", where), s.answer)
                     for s in traj.retrieval_steps)  # fmt: skip
        qid, question, images = traj.id, traj.question, tuple(traj.images)
    elif "question" in row:
        answers = tuple(str(a) for a in (row.get("answers") or row.get("golden_answers") or ()))
        steps = row.get("gold_steps")
        gold = None
        if steps is not None:
            if not isinstance(steps, list) or any(not isinstance(s, dict) or "sub_question" not in s or "kb" not in s
                                                  for s in steps):  # fmt: skip
                raise ValueError(f"{where}: `gold_steps` is a list of {{sub_question, kb, answer}}; got {steps!r}")
            gold = tuple(GoldStep(str(s["sub_question"]), kb_id(str(s["kb"]), kbs, "display_name", where),
                                  str(s.get("answer", "")))
                         for s in steps)  # fmt: skip
        qid, question, images = str(row.get("id", where)), str(row["question"]), tuple(row.get("images") or ())
    else:
        raise ValueError(f"{where}: an online training row is a trajectory or a question (needs `question`); "
                         f"got keys {sorted(row)}")  # fmt: skip
    if not answers:
        raise ValueError(f"{where}: question {qid!r} has no gold answers; the outcome and final rewards need them")
    return OnlineQuestion(qid, question, answers, images, gold or None)


def load_online_questions(cfg: StepGRPOConfig, kbs: Sequence[NamedKB]) -> list[OnlineQuestion]:
    """Read and check the training questions; no model or index is touched.

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: a row is malformed, has no answers, names an unknown KB, or has no gold steps while step
            rewards are required (ask or route with weight > 0) and `online_rollout.allow_outcome_only` is false.
    """
    settings = cfg.online_settings()
    path = Path(cfg.train_file)
    if not path.is_file():
        raise FileNotFoundError(f"training file not found: {path}")
    out, skipped_images = [], 0
    for n, row in iter_jsonl_objects(path):
        q = question_from_row(row, kbs, f"{path}:{n}")
        if q is not None and q.images:
            skipped_images += 1
        elif q is not None:
            out.append(q)
    if skipped_images:  # the policy would need the pixels threaded through TRL's forward pass too
        logger.warning("skipped %d image questions of %s: online rollouts take text questions in this version",
                       skipped_images, path)  # fmt: skip
    if not out:
        raise ValueError(f"{path} holds no usable questions")
    if cfg.sample_seed is not None:
        random.Random(cfg.sample_seed).shuffle(out)
    if cfg.max_train_samples is not None:
        out = out[: cfg.max_train_samples]
    required = [s.name for s in cfg.reward_specs() if s.name in STEP_REWARDS and s.weight > 0]
    missing = [q.id for q in out if q.gold_steps is None]
    if missing and required and not settings.allow_outcome_only:
        raise ValueError(
            f"{len(missing)} question(s) have no gold steps (e.g. {missing[:3]}) but the step rewards {required} "
            f"need them: train on trajectories with gold steps, set their weights to 0, or set "
            "`online_rollout: {allow_outcome_only: true}` to train those questions on the outcome alone"
        )
    if missing:
        logger.info("%d of %d questions have no gold steps: they train on the outcome and final accuracy alone",
                    len(missing), len(out))  # fmt: skip
    return out


# -- rewards on online rows -----------------------------------------------------------------------------------------
class OnlineRowReward:
    """A recipe reward on online rows: None on padding rows and, with `needs_gold`, on rows without gold.

    Keeps the last call's output (`last`) for the per-step-type monitors.
    """

    def __init__(self, inner, needs_gold: bool):
        self.inner = inner
        self.needs_gold = needs_gold
        self.__name__ = inner.__name__
        self.last: list[float | None] = []

    def __call__(self, completions: list, **kwargs) -> list[float | None]:
        n = len(completions)
        keep = [i for i in range(n) if not kwargs["is_pad"][i] and (kwargs["has_gold"][i] or not self.needs_gold)]
        out: list[float | None] = [None] * n
        if keep:
            per_row = {k: [v[i] for i in keep] for k, v in kwargs.items() if isinstance(v, list) and len(v) == n}
            other = {k: v for k, v in kwargs.items() if k not in per_row}
            for i, r in zip(keep, self.inner([completions[i] for i in keep], **per_row, **other), strict=True):
                out[i] = r
        self.last = out
        return out


class OutcomeReward:
    """`outcome_reward`: the sibling's final accuracy, discounted by γ^d over the d steps after its own."""

    __name__ = "outcome_reward"

    def __init__(self):
        self.last: list[float | None] = []

    def __call__(self, completions: list, **kwargs) -> list[float | None]:
        self.last = [None if pad else float(r) for pad, r in zip(kwargs["is_pad"], kwargs["outcome_return"],
                                                                  strict=True)]  # fmt: skip
        return self.last


def online_rewards(cfg: StepGRPOConfig) -> list:
    """The recipe's rewards wrapped for online rows, then `outcome_reward` (weights: recipe order, outcome last)."""
    from training.trainers import build_rewards

    wrapped = [OnlineRowReward(f, needs_gold=spec.name != "format")
               for f, spec in zip(build_rewards(cfg), cfg.reward_specs(), strict=True)]  # fmt: skip
    return [*wrapped, OutcomeReward()]


# -- rows -----------------------------------------------------------------------------------------------------------
def tree_rows(tree: StepTree, kb_names: list[str], discount: float) -> list[dict]:
    """One row per sibling, G consecutive rows per anchor, with the gold columns the recipe rewards read."""
    rows = []
    for i, (anchor, messages, sibs) in enumerate(zip(tree.anchors, tree.anchor_messages, tree.siblings, strict=True)):
        q = tree.questions[anchor.q]
        k = anchor.searches
        gold = q.gold_steps
        row = {"step_type": anchor.phase, "gold_sub_question": None, "gold_kb": None, "gold_answers": [],
               "kb_names": list(kb_names), "has_gold": True, "question_id": q.id, "anchor": f"{q.id}/{i}"}  # fmt: skip
        if anchor.phase == PLAN:
            row["has_gold"] = gold is not None
            if gold is not None and k < len(gold):
                row["gold_sub_question"], row["gold_kb"] = gold[k].sub_question, gold[k].kb
        elif anchor.phase == ANSWER:
            answer = gold[k].answer if gold is not None and k < len(gold) else ""
            row["has_gold"] = bool(answer)
            row["gold_answers"] = [answer] if answer else []
        else:
            row["gold_answers"] = list(q.answers)
        for sb in sibs:
            rows.append({**row, "prompt": messages, "is_pad": False,
                         "outcome_return": discount**sb.steps_after * sb.outcome, "_step": sb.step})  # fmt: skip
    return rows


def pad_row(like: dict, eos_id: int) -> dict:
    """A row that carries no loss and no reward: it only evens out row counts across processes."""
    return {**like, "is_pad": True, "has_gold": False, "outcome_return": 0.0,
            "_step": Generated(like["_step"].prompt_ids, [eos_id], "", None)}  # fmt: skip


def well_formed(step_type: str, text: str, kb_names: list[str], require_think: bool) -> bool:
    if step_type == PLAN:
        return parse_plan(text, kb_names, require_think=require_think).ok
    return parse_answer(text, require_think=require_think).ok


# -- the run: tree building, the rollout_func, monitors -------------------------------------------------------------
class OnlineRun:
    """State of an online run shared by the trainer's one override and its `rollout_func`."""

    def __init__(self, settings: OnlineSettings, kbs: dict, questions: list[OnlineQuestion], rewards: list):
        self.settings = settings
        self.kbs = kbs
        self.questions = questions
        self.rewards = rewards
        self.kb_names = list(kbs)
        self._pending: dict | None = None
        self._zero_std: collections.deque = collections.deque(maxlen=settings.collapse_window)
        self._violations: collections.deque = collections.deque(maxlen=settings.collapse_window)
        self.rollout_s: list[float] = []
        self.last_tree: StepTree | None = None
        self.last_rows: list[dict] = []

    # generation through TRL's own path (transformers generate, or vLLM colocate/server)
    def generate_fn(self, trainer):
        def generate(prompts: list[list[dict]], n: int) -> list[Generated]:
            reps = [p for p in prompts for _ in range(n)]
            real = len(reps)
            if trainer.use_vllm:
                # TRL's vLLM generation gathers the prompts of every process and slices the answers back by equal
                # counts, so every process sends as many as the busiest one (padding is generated, then dropped)
                import torch

                count = torch.tensor([real], device=trainer.accelerator.device)
                most = int(trainer.accelerator.gather(count).max())
                filler = reps[:n] if reps else [[{"role": "user", "content": "."}]] * n
                while len(reps) < most:
                    reps += filler
            if not reps:
                return []
            prompt_ids, images, mm = trainer._tokenize_prompts(reps)
            completion_ids, logprobs = trainer._generate_single_turn(prompt_ids, images, mm, n)
            prompt_ids, completion_ids = prompt_ids[:real], completion_ids[:real]
            logprobs = logprobs[:real] if logprobs is not None else None
            texts = trainer.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
            lps = logprobs if logprobs is not None else [None] * len(texts)
            return [Generated(list(p), list(c), t, lp)
                    for p, c, t, lp in zip(prompt_ids, completion_ids, texts, lps, strict=True)]  # fmt: skip

        return generate

    def expand(self, trainer, inputs: list[dict]) -> list[dict]:
        """The generation batch's questions → their step trees → rows (padded to the largest process's count)."""
        import torch

        g = trainer.num_generations
        if len(inputs) % g:
            raise RuntimeError(f"{len(inputs)} rows on this process is not a multiple of num_generations={g}")
        questions = [self.questions[x["question_index"]] for x in inputs[::g]]
        t0 = time.perf_counter()
        error: RetrievalFailed | None = None
        tree = None
        try:
            tree = StepTreeRollout(self.generate_fn(trainer), self.kbs, self.settings).build(questions, g)
        except RetrievalFailed as e:
            error = e
        failed = trainer.accelerator.gather(torch.tensor([int(error is not None)], device=trainer.accelerator.device))
        if int(failed.sum()) > 0:
            self._stop_with_checkpoint(trainer, error)
        self.rollout_s.append(time.perf_counter() - t0)
        rows = tree_rows(tree, self.kb_names, self.settings.discount)
        n = torch.tensor([len(rows)], device=trainer.accelerator.device)
        most = int(trainer.accelerator.gather(n).max())
        unit = g * trainer.args.steps_per_generation
        target = math.ceil(most / unit) * unit
        eos = trainer.eos_token_ids[0] if trainer.eos_token_ids else trainer._tokenizer.eos_token_id
        rows += [pad_row(rows[0], eos) for _ in range(target - len(rows))]
        steps = [r.pop("_step") for r in rows]
        has_lp = all(s.logprobs is not None for s in steps if s.completion_ids)
        self._pending = {
            "prompt_ids": [s.prompt_ids for s in steps],
            "completion_ids": [s.completion_ids for s in steps],
            "logprobs": [s.logprobs if s.logprobs is not None else [0.0] for s in steps] if has_lp else None,
            "env_mask": [[0 if r["is_pad"] else 1] * len(s.completion_ids) for r, s in zip(rows, steps, strict=True)],
        }
        for r, s in zip(rows, steps, strict=True):
            r["_text"] = s.text
        self.last_tree, self.last_rows = tree, rows
        return [{k: v for k, v in r.items() if k != "_text"} for r in rows]

    def rollout_func(self, prompts: list, trainer) -> dict:
        """TRL's `rollout_func`: hands over the token ids of the rows `expand` built (it already generated them)."""
        pending, self._pending = self._pending, None
        if pending is None or len(pending["prompt_ids"]) != len(prompts):
            raise RuntimeError("online rollout_func called without rows from OnlineStepGRPOTrainer")
        return pending

    def _stop_with_checkpoint(self, trainer, error: Exception | None) -> None:
        step = trainer.state.global_step
        trainer._save_checkpoint(trainer.model, trial=None)
        where = Path(trainer.args.output_dir) / f"checkpoint-{step}"
        reason = error or "retrieval failed on another process"
        raise RetrievalFailed(
            f"stopped at global step {step}: {reason}. Saved {where}; once the KBs answer again (start the retrieval "
            "service, or fix `remote:` in the KB YAML) rerun with --resume_from_checkpoint true"
        ) from error

    # monitors
    def log(self, trainer, output: dict) -> dict[str, float]:
        """Per step type: each reward component, advantage std, zero-std sibling groups, tag violations; the
        rollout costs; and a warning when the signs of collapse persist. Returns what it logged."""
        import torch

        rows, g, tree = self.last_rows, trainer.num_generations, self.last_tree
        weights = trainer.reward_weights.tolist()
        adv = output["advantages"].detach().float().cpu().tolist()
        real = [i for i, r in enumerate(rows) if not r["is_pad"]]
        totals = [sum(w * f.last[i] for w, f in zip(weights, self.rewards, strict=True) if f.last[i] is not None)
                  for i in range(len(rows))]  # fmt: skip
        logged: dict[str, float] = {}
        all_groups, all_zero, all_bad = 0, 0, []
        for t in (PLAN, ANSWER, FINAL):
            idx = [i for i in real if rows[i]["step_type"] == t]
            if not idx:
                continue
            for f in self.rewards:
                vals = [f.last[i] for i in idx if f.last[i] is not None]
                if vals:
                    logged[f"online/{t}/{f.__name__}"] = sum(vals) / len(vals)
            a = torch.tensor([adv[i] for i in idx])
            logged[f"online/{t}/advantage_std"] = a.std().item() if len(idx) > 1 else 0.0
            starts = [i for i in idx if i % g == 0]
            zero = sum(torch.tensor(totals[i : i + g]).std().item() < 1e-6 for i in starts)
            logged[f"online/{t}/zero_std_groups"] = zero / len(starts)
            bad = [not well_formed(t, rows[i]["_text"], self.kb_names, self.settings.require_think) for i in idx]
            logged[f"online/{t}/tag_violation"] = sum(bad) / len(bad)
            all_groups, all_zero, all_bad = all_groups + len(starts), all_zero + zero, all_bad + bad
        s = tree.stats
        n_traj = len(tree.questions) + sum(len(x) for x in tree.siblings)
        logged.update({
            "online/rollout_s": self.rollout_s[-1], "online/spine_s": s.spine_s, "online/branch_s": s.branch_s,
            "online/retrieval_s": s.retrieval_s,
            "online/branch_time_share": s.branch_s / max(s.spine_s + s.branch_s, 1e-9),
            "online/branch_step_share": s.branch_steps / max(s.spine_steps + s.branch_steps, 1),
            "online/anchors_per_question": len(tree.anchors) / max(len(tree.questions), 1),
            "online/retrieval_calls_per_question": s.retrieval_calls / max(len(tree.questions), 1),
            "online/retrieval_calls_per_trajectory": s.retrieval_calls / max(n_traj, 1),
            "online/rows": float(len(real)), "online/pad_rows": float(len(rows) - len(real)),
        })  # fmt: skip
        for key, value in logged.items():
            trainer._metrics["train"][key].append(value)
        self._watch(all_zero / max(all_groups, 1), sum(all_bad) / max(len(all_bad), 1), trainer.state.global_step)
        return logged

    def _watch(self, zero_share: float, violation: float, step: int) -> None:
        s = self.settings
        self._zero_std.append(zero_share)
        self._violations.append(violation)
        full = len(self._zero_std) == s.collapse_window
        if full and min(self._zero_std) >= s.collapse_zero_std:
            logger.warning("online Step-GRPO, step %d: %.0f%%+ of sibling groups had zero reward std for %d steps "
                           "(no learning signal: an early sign of collapse; raise temperature or G)",
                           step, 100 * s.collapse_zero_std, s.collapse_window)  # fmt: skip
        if full and min(self._violations) >= s.collapse_tag_violation:
            logger.warning("online Step-GRPO, step %d: tag-violation rate >= %.0f%% for %d steps (the policy is "
                           "losing the step format: an early sign of collapse; lower the learning rate)",
                           step, 100 * s.collapse_tag_violation, s.collapse_window)  # fmt: skip


def online_trainer_class():
    """`OnlineStepGRPOTrainer`, built on first use so importing this module does not import TRL's trainer."""
    from trl import GRPOTrainer

    class OnlineStepGRPOTrainer(GRPOTrainer):
        """`GRPOTrainer` with one override, `_generate_and_score_completions`.

        Why a subclass: TRL ties a generation batch's rows to the prompts its sampler drew (G rows per question), and
        `rollout_func` must return exactly that many. An online step tree has G rows per *visited step*, a number only
        the rollout knows, and TRL's advantages are one scalar per row. So this method first expands the questions
        into their rows (one per sibling step, grouped by anchor), then lets TRL score, normalise (each run of G rows
        is one anchor's siblings) and train them unchanged; `rollout_func` hands TRL the already generated tokens.
        """

        def _generate_and_score_completions(self, inputs):
            rows = self.online.expand(self, inputs)
            output = super()._generate_and_score_completions(rows)
            self.online.log(self, output)
            return output

    return OnlineStepGRPOTrainer


def timing_callback(trainer):
    """Logs each optimizer step's train time (its wall time less the rollout) next to `online/rollout_s`."""
    from transformers import TrainerCallback

    online = trainer.online

    class OnlineTiming(TrainerCallback):
        def __init__(self):
            self.t0 = 0.0
            self.n_rollouts = 0

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()
            self.n_rollouts = len(online.rollout_s)

        def on_step_end(self, args, state, control, **kwargs):
            wall = time.perf_counter() - self.t0
            rollout = sum(online.rollout_s[self.n_rollouts :])
            trainer._metrics["train"]["online/train_s"].append(wall - rollout)
            tree = online.last_tree
            rows = sum(len(g) for g in tree.siblings) if tree else 0
            trajectories = rows + (len(tree.questions) if tree else 0)  # every sibling is run to its end, + spines
            logger.info("online step %d, process %d: rollout %.1f s, train %.1f s; %d sibling rows, %d trajectories, "
                        "%.3f trajectories/s", state.global_step, args.process_index, rollout, wall - rollout, rows,
                        trajectories, trajectories / max(wall, 1e-9))  # fmt: skip

    return OnlineTiming()


def build_online_grpo_trainer(cfg: StepGRPOConfig):
    """Online Step-GRPO: questions and KB names checked first, then the KBs, the policy and the trainer."""
    import datasets

    from agent.kbs import kb_configs, load_knowledge_bases
    from training.trainers import (
        grpo_trainer_class,
        is_vision_language,
        load_processing_class,
        make_trainer,
        resolve_model_path,
    )

    settings = cfg.online_settings()
    kb_file = Path(settings.kb)
    if not kb_file.is_file():
        raise FileNotFoundError(f"online_rollout.kb: no KB YAML at {kb_file}")
    questions = load_online_questions(cfg, kb_configs(kb_file))  # every data error before anything loads
    model_path = resolve_model_path(cfg.model_name_or_path)
    if is_vision_language(model_path):
        logger.info("vision-language policy: online rollouts are text-only in this version")
    rewards = online_rewards(cfg)
    kbs = load_knowledge_bases(str(kb_file))
    processing_class = load_processing_class(model_path)
    first = StepTreeRollout(lambda p, n: [], kbs, settings)  # renders the first plan prompt (TRL wants a prompt)
    ds = datasets.Dataset.from_dict({
        "prompt": [first.messages(StepState(0, PLAN), q) for q in questions],
        "question_index": list(range(len(questions))),
    })  # fmt: skip
    logger.info("online Step-GRPO on %d questions, KBs %s, G=%d", len(questions), list(kbs), cfg.num_generations)
    cfg.reward_weights = [*[s.weight for s in cfg.reward_specs()], settings.outcome_weight]
    online = OnlineRun(settings, kbs, questions, rewards)
    trainer_cls = grpo_trainer_class(online_trainer_class(), cfg)
    trainer = make_trainer(trainer_cls, cfg, model_path, processing_class, ds, reward_funcs=rewards,
                           rollout_func=online.rollout_func)  # fmt: skip
    trainer.online = online
    trainer.add_callback(timing_callback(trainer))
    return trainer
