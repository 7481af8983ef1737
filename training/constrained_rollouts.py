"""Step-GRPO samples drawn under the step grammars, as the constrained agent decodes (`constrained_rollouts: true`).

Why: the agent decodes every step under its grammar (`agent.constrained`, `agent/protocol/grammar.py`), so training
samples drawn freely come from another distribution than the one a user gets: a weak policy at temperature 1 writes
many malformed steps, the format gate scores them 0, and part of the signal goes to tags the grammar already
guarantees. Under the grammar every sample is well formed, so the differences within a group come from the
search-or-stop decision, the KB, the sub-question and the answer. Measured (stop 25, model card): it did not keep
Step-GRPO from losing the stop decision, which free sampling lost as well (stop 24); the cause lies elsewhere.

How: TRL's `rollout_func` contract, on the transformers generation path. The trainer's one override notes each row's
step type and KB list (dataset columns) before TRL generates; the rollout tokenizes the prompts as TRL does and
samples with the policy's `generate` plus xgrammar's logits processor, one grammar per row, each compiled once per
KB set (`agent.backends.constrained`). The loss is TRL's own, on the policy's unmasked log-probabilities of the
sampled tokens; the samples come from the grammar-masked distribution (as with vLLM's guided decoding in TRL).

Both this rollout and the free one (`free_rollout_func`, which Step-GRPO on a text policy without vLLM uses in place
of TRL's own transformers rollout) prefill each distinct prompt of a batch once (`training/shared_prefill.py`) and
sample with a LoRA adapter merged into the weights (`training/merged_rollouts.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.protocol import answer_grammar, plan_grammar
from training import shared_prefill
from training.merged_rollouts import merged_lora
from training.rewards import PLAN


def row_grammar(step_type: str, kb_names: Sequence[str], grammar_tokens: dict, allow_stop: bool = True) -> str:
    """The EBNF a step of this type over these KBs is sampled under (the grammars of `grammar_tokens` budgets);
    `allow_stop=False` drops a plan's stop branch (a step that must search, `agent.min_steps`)."""
    if step_type == PLAN:
        return plan_grammar(tuple(kb_names), int(grammar_tokens[PLAN]), allow_stop).ebnf
    return answer_grammar(int(grammar_tokens[step_type])).ebnf


def cut_at_eos(ids: Sequence[int], eos_ids: Sequence[int]) -> list[int]:
    """Token ids up to and including the first end-of-sequence token (what TRL keeps of a completion)."""
    eos = set(eos_ids)
    for i, t in enumerate(ids):
        if t in eos:
            return list(ids[: i + 1])
    return list(ids)


class ConstrainedRollouts:
    """State shared by `ConstrainedStepGRPOTrainer` (which notes the rows) and its `rollout_func` (which samples)."""

    def __init__(self, grammar_tokens: dict, min_steps: int = 0):
        self.grammar_tokens = dict(grammar_tokens)
        self.min_steps = min_steps  # plan rows before this step index must search (the agent's `min_steps`)
        self._grammars: list[str] | None = None

    def note(self, inputs: list[dict]) -> None:
        """The grammar of every row of the generation batch, in TRL's order (G rows per prompt)."""
        self._grammars = self.grammars(inputs)

    def grammars(self, inputs: list[dict]) -> list[str]:
        """Each row's step grammar: its step type over its KB list, no stop branch before step `min_steps`."""
        return [
            row_grammar(r["step_type"], r["kb_names"], self.grammar_tokens,
                        allow_stop=not self.min_steps or r["step_index"] >= self.min_steps)
            for r in inputs
        ]  # fmt: skip

    def rollout_func(self, prompts: list, trainer) -> dict:  # noqa: ANN001 - a GRPOTrainer
        grammars, self._grammars = self._grammars, None
        if grammars is None or len(grammars) != len(prompts):
            raise RuntimeError("constrained rollout_func called without the rows noted by ConstrainedStepGRPOTrainer")
        prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
        completion_ids = sample(trainer, prompt_ids, grammars)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


def free_rollout_func(prompts: list, trainer) -> dict:  # noqa: ANN001 - a GRPOTrainer
    """TRL's transformers rollout (its generation config, no grammar), each distinct prompt prefilled once."""
    prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
    return {"prompt_ids": prompt_ids, "completion_ids": sample(trainer, prompt_ids, None), "logprobs": None}


def sample(trainer, prompt_ids: list[list[int]], grammars: list[str] | None) -> list[list[int]]:  # noqa: ANN001
    """One completion per prompt row, sampled with the trainer's generation config, under that row's grammar (none
    where `grammars` is None)."""
    import torch
    from trl.models import unwrap_model_for_generation

    from agent.backends.constrained import grammar_processor

    tok = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    width = max(len(p) for p in prompt_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else trainer.eos_token_ids[0]
    device = trainer.accelerator.device
    input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompt_ids], device=device)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=device)
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            generation_kwargs=trainer.generation_kwargs,
        ) as model,
        torch.no_grad(),
        merged_lora(model, sharded=trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled),
    ):
        processors = [grammar_processor(model, tok, grammars)] if grammars is not None else []
        out = shared_prefill.generate(model, input_ids, attention, logits_processor=processors,
                                      generation_config=trainer.generation_config)  # fmt: skip
    return [cut_at_eos(row.tolist(), trainer.eos_token_ids) for row in out[:, width:].cpu()]


def constrained_trainer_class():
    """`ConstrainedStepGRPOTrainer`, built on first use so importing this module does not import TRL's trainer."""
    from trl import GRPOTrainer

    class ConstrainedStepGRPOTrainer(GRPOTrainer):
        """`GRPOTrainer` whose rollouts are sampled under each row's step grammar.

        Why a subclass: `rollout_func` receives the prompts only, and a row's grammar depends on its step type and
        KB list (dataset columns); this override notes them for the rollout before TRL generates and scores.
        """

        def _generate_and_score_completions(self, inputs):
            self.constrained.note(inputs)
            return super()._generate_and_score_completions(inputs)

    return ConstrainedStepGRPOTrainer
