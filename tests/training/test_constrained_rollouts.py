"""Step-GRPO rollouts under the step grammars: the right grammar per row, and on real SmolLM2 (which at temperature 1
writes malformed steps when free) every sampled plan and final step is well formed while GRPO still trains."""

from __future__ import annotations

import pytest

from agent.protocol import answer_grammar, plan_grammar
from training.config import load_config
from training.constrained_rollouts import ConstrainedRollouts, cut_at_eos, row_grammar
from training.trainers import build_grpo_trainer, train

from .conftest import CPU_GRPO_RECIPE
from .test_train import FAST_GRPO, changed, finite_logs, snapshot

BUDGETS = {"plan": 224, "answer": 96, "final": 96}


def test_each_row_gets_the_grammar_of_its_step_type_and_kb_list():
    kbs = ["Text Retriever", "Clip Retriever"]
    plan = row_grammar("plan", kbs, BUDGETS)
    assert plan == plan_grammar(tuple(kbs), 224).ebnf
    assert '"Text Retriever"' in plan and '"Clip Retriever"' in plan and "Table" not in plan
    assert row_grammar("final", kbs, BUDGETS) == answer_grammar(96).ebnf
    must_search = row_grammar("plan", kbs, BUDGETS, allow_stop=False)
    assert must_search == plan_grammar(tuple(kbs), 224, allow_stop=False).ebnf and "(ask | stop)" not in must_search
    assert row_grammar("plan", kbs[::-1], BUDGETS) != plan  # the KB list (and its order) is the prompt's


def test_rollout_min_steps_drops_the_stop_branch_on_early_plan_rows_only():
    kbs = ["Text Retriever", "Clip Retriever"]
    rows = [{"step_type": "plan", "kb_names": kbs, "step_index": i} for i in (0, 1)]
    rows.append({"step_type": "final", "kb_names": kbs, "step_index": 0})
    first, second, final = ConstrainedRollouts(BUDGETS, min_steps=1).grammars(rows)
    assert first == row_grammar("plan", kbs, BUDGETS, allow_stop=False) != second
    assert second == row_grammar("plan", kbs, BUDGETS) and final == row_grammar("final", kbs, BUDGETS)
    assert ConstrainedRollouts(BUDGETS).grammars(rows)[0] == second  # min_steps 0: every plan row may stop


def test_cut_at_eos_keeps_the_first_eos_and_nothing_after():
    assert cut_at_eos([5, 6, 2, 7, 2], [2]) == [5, 6, 2]
    assert cut_at_eos([5, 6], [2]) == [5, 6]


def test_rollout_without_noted_rows_is_refused():
    rollouts = ConstrainedRollouts(BUDGETS)
    with pytest.raises(RuntimeError, match="without the rows noted"):
        rollouts.rollout_func([[{"role": "user", "content": "q"}]], trainer=None)
    rollouts.note([{"step_type": "final", "kb_names": ["Text Retriever"]}] * 2)
    with pytest.raises(RuntimeError, match="without the rows noted"):  # 3 prompts, 2 rows noted
        rollouts.rollout_func([[{"role": "user", "content": "q"}]] * 3, trainer=None)


def test_constrained_rollouts_sample_only_well_formed_steps(smollm2_dir, short_steps_file, tmp_path):
    budgets = "{plan: 224, answer: 96, final: 96}"
    cfg = load_config("grpo", CPU_GRPO_RECIPE, ["--train_file", str(short_steps_file), "--train_format", "steps",
                                                 "--output_dir", str(tmp_path), *FAST_GRPO, "--max_steps", "1",
                                                 "--max_completion_length", "224", "--grammar_tokens", budgets,
                                                 "--constrained_rollouts", "true"])  # fmt: skip
    trainer = build_grpo_trainer(cfg)
    assert type(trainer).__name__ == "ConstrainedStepGRPOTrainer"
    before = snapshot(trainer.model)
    train(trainer, cfg)
    assert trainer.state.global_step == 1
    assert changed(before, trainer.model), "no parameter changed after a constrained GRPO step"
    history = trainer.state.log_history
    # every completion (a plan and a final prompt, G=2 each) parsed: the format gate passed all of them
    assert finite_logs(history, "rewards/format_reward/mean") == [1.0]
    assert finite_logs(history, "format/violation_rate") == [0.0]
