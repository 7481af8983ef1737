"""Online Step-GRPO: SmolLM2 (the shipped router adapter) trains on live step trees through a real KB, served by the
retrieval service; the service goes down, the run stops with a checkpoint, and a restarted run resumes from it (slow).

One scenario (module fixture, ~1 min alone on 2 cores, several when they are busy) runs the model; the tests read what
it recorded. Bad input is checked without a model.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from training.config import load_config

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "train" / "smollm2_online_grpo_cpu.yaml"
ADAPTER = REPO / "models" / "smollm2-kbrouter"
DEMO = REPO / "data" / "demo"

# a real demo question, with one hand-written gold step over the demo passages
GOLD_QUESTION = {
    "id": "demo-0",
    "question": "What science fantasy young adult series, told in first person, has a set of companion books "
    "narrating the stories of enslaved worlds and alien species?",
    "answers": ["Animorphs"],
    "gold_steps": [{"sub_question": "Which young adult series has companion books about enslaved worlds and alien "
                    "species?", "kb": "text", "answer": "Animorphs"}],
}  # fmt: skip
PLAIN_QUESTION = {"id": "demo-1", "question": "2014 S/S is the debut album of a South Korean boy group that was "
                  "formed by who?", "answers": ["YG Entertainment"]}  # fmt: skip


def _kb_yaml(path: Path, index_root: Path, remote: str | None = None) -> Path:
    """Two BM25 KBs over the demo passages and tables (built in seconds), local or behind the retrieval service."""
    opts = f"{{remote: {remote}, remote_retries: 1}}" if remote else "{max_rows: 10}"
    text_opts = f"    options: {opts}\n" if remote else ""
    path.write_text(
        "knowledge_bases:\n"
        "  - name: text\n    display_name: Text Retriever\n    description: Wikipedia paragraphs.\n    kind: text\n"
        f"    granularity: paragraph\n    corpus: {DEMO / 'passages.jsonl'}\n    search: bm25\n"
        f"    index_dir: {index_root / 'text'}\n    k: 2\n{text_opts}"
        "  - name: table\n    display_name: Table Retriever\n    description: Wikipedia tables.\n    kind: table\n"
        f"    granularity: table\n    corpus: {DEMO / 'tables'}\n    search: bm25\n"
        f"    index_dir: {index_root / 'table'}\n    k: 2\n    options: {opts}\n"
    )
    return path


def _questions(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _args(tmp: Path, kb: Path, questions: Path, *extra: str) -> list[str]:
    return ["--init_adapter", str(ADAPTER), "--train_file", str(questions),
            "--online_rollout", f"{{kb: {kb}, max_steps: 1, top_k: 1, evidence_chars: 120}}",
            "--num_generations", "2", "--per_device_train_batch_size", "2", "--max_completion_length", "64",
            "--beta", "0.01", "--save_steps", "10", "--output_dir", str(tmp / "run"), *extra]  # fmt: skip


@pytest.fixture(scope="module")
def scenario(smollm2_dir, tmp_path_factory):
    """Steps 1-2 train through the retrieval service; it is stopped; step 3 fails and saves checkpoint-2."""
    from agent.kbs import load_knowledge_bases
    from retrievers.service import create_app, serve_in_thread
    from training.online_grpo import build_online_grpo_trainer
    from training.rollouts import RetrievalFailed
    from training.trainers import train

    tmp = tmp_path_factory.mktemp("online")
    local = load_knowledge_bases(str(_kb_yaml(tmp / "local.yaml", tmp / "idx")))
    app = create_app({kb.name: kb.retriever for kb in local.values()})
    questions = _questions(tmp / "q.jsonl", [GOLD_QUESTION])
    out: dict = {"tmp": tmp, "batches": [], "expand_steps": []}

    def spy(trainer, phase: str):
        online = trainer.online
        log, expand = online.log, online.expand

        def logging(tr, output):
            out["batches"].append((phase, [dict(r) for r in online.last_rows], {k: v for k, v in output.items()},
                                   online.last_tree))  # fmt: skip
            return log(tr, output)

        def expanding(tr, inputs):
            out["expand_steps"].append((phase, tr.state.global_step))
            return expand(tr, inputs)

        online.log, online.expand = logging, expanding

    from transformers import TrainerCallback

    with contextlib.ExitStack() as service:
        url = service.enter_context(serve_in_thread(app))

        class StopServiceAfterStep2(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == 2:
                    service.close()  # the retrieval service goes down between two optimizer steps

        kb = _kb_yaml(tmp / "remote.yaml", tmp / "idx", remote=url)
        cfg = load_config("grpo", RECIPE, _args(tmp, kb, questions, "--max_steps", "3"))
        trainer = build_online_grpo_trainer(cfg)
        spy(trainer, "first")
        trainer.add_callback(StopServiceAfterStep2())
        out["before"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        with pytest.raises(RetrievalFailed) as failure:
            train(trainer, cfg)
        out["failure"] = str(failure.value)
        out["after"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        out["log_history"] = list(trainer.state.log_history)
        out["tokenizer"] = trainer.processing_class
    out["app"], out["url"], out["kb"], out["questions"], out["spy"] = app, url, kb, questions, spy
    return out


def test_two_online_steps_change_the_parameters(scenario):
    assert [s for p, s in scenario["expand_steps"] if p == "first"][:2] == [0, 1]
    changed = [n for n, p in scenario["after"].items() if not (p == scenario["before"][n]).all()]
    assert changed, "no trainable parameter moved after two online optimizer steps"
    assert any("lora" in n for n in changed)


def test_every_component_is_logged(scenario):
    logs = [h for h in scenario["log_history"] if "loss" in h]
    assert len(logs) == 2
    keys = set().union(*logs)
    for name in ("ask", "route", "answer", "format", "outcome"):
        assert f"rewards/{name}_reward/mean" in keys
    for t in ("plan", "final"):  # every tree has a plan and a final step
        for k in ("advantage_std", "zero_std_groups", "tag_violation", "format_reward", "outcome_reward"):
            assert f"online/{t}/{k}" in keys, (t, k)
    assert "online/plan/ask_reward" in keys and "online/final/answer_reward" in keys
    for k in (
        "kl",
        "online/rollout_s",
        "online/train_s",
        "online/branch_time_share",
        "online/branch_step_share",
        "online/retrieval_calls_per_question",
        "online/retrieval_calls_per_trajectory",
        "step_time",
    ):
        assert k in keys, k
    assert all(h["online/rollout_s"] > 0 and h["online/train_s"] > 0 for h in logs)


def test_siblings_share_their_anchor_prefix_token_for_token(scenario):
    g = 2
    for _, rows, output, tree in scenario["batches"]:
        ids, mask = output["prompt_ids"], output["prompt_mask"]
        prompts = [ids[i][mask[i].bool()].tolist() for i in range(len(rows))]
        for start in range(0, len(rows), g):
            group = rows[start : start + g]
            if group[0]["is_pad"]:
                continue
            assert len({r["anchor"] for r in group}) == 1
            assert prompts[start] == prompts[start + 1]  # what TRL trains on, token for token
        assert len(prompts) == len(tree.anchors) * g + sum(r["is_pad"] for r in rows)
        anchors = [prompts[i] for i in range(0, len(tree.anchors) * g, g)]
        assert len({tuple(p) for p in anchors}) == len(anchors)  # different states, different prefixes


def test_evidence_tokens_carry_no_loss(scenario):
    """The loss covers exactly the tokens the policy sampled; retrieved evidence sits only in the (loss-free) prompt."""
    from agent.protocol import render_hits

    tok = scenario["tokenizer"]
    answer_rows = 0
    for _, rows, output, tree in scenario["batches"]:
        loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
        sibs = [sb for group in tree.siblings for sb in group]
        for i, row in enumerate(rows):
            trained = output["completion_ids"][i][loss_mask[i].bool()].tolist()
            if row["is_pad"]:
                assert trained == []
                continue
            assert trained == sibs[i].step.completion_ids  # sampled by the policy, nothing inserted
            if row["step_type"] == "answer":
                answer_rows += 1
                evidence = render_hits(sibs[i].anchor.hits, 120)
                prompt = tok.decode(output["prompt_ids"][i][output["prompt_mask"][i].bool()])
                assert sibs[i].anchor.hits and evidence.strip() in prompt
    seen = [(r["step_type"], r["is_pad"]) for _, rows, _, _ in scenario["batches"] for r in rows]
    assert answer_rows > 0, f"no answer step was trained on, so evidence masking went unchecked; rows: {seen}"


def test_service_down_stops_the_run_with_a_checkpoint(scenario):
    from training.trainers import checkpoint_problems

    assert "stopped at global step 2" in scenario["failure"]
    assert "did not answer after 2 attempts" in scenario["failure"]  # the client's bounded retries, then stop
    assert "--resume_from_checkpoint true" in scenario["failure"]
    checkpoint = scenario["tmp"] / "run" / "checkpoint-2"  # save_steps 10: only the failure saved it
    assert checkpoint_problems(checkpoint) == []


@pytest.mark.slow  # one more online step (~1-5 min on 2 cores)
def test_the_restarted_run_resumes_at_the_same_global_step(scenario):
    from retrievers.service import serve_in_thread
    from training.online_grpo import build_online_grpo_trainer
    from training.trainers import train

    port = int(scenario["url"].rsplit(":", 1)[1])
    with serve_in_thread(scenario["app"], port=port):  # the service is back on the same address
        args = _args(scenario["tmp"], scenario["kb"], scenario["questions"], "--max_steps", "3",
                     "--resume_from_checkpoint", "true")  # fmt: skip
        cfg = load_config("grpo", RECIPE, args)
        resumed = build_online_grpo_trainer(cfg)
        scenario["spy"](resumed, "resumed")
        train(resumed, cfg)
    assert [s for p, s in scenario["expand_steps"] if p == "resumed"] == [2]
    assert resumed.state.global_step == 3


# -- bad input, before any model loads ------------------------------------------------------------------------------
@pytest.fixture
def no_model(monkeypatch):
    import training.trainers

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")

    import training.online_grpo

    monkeypatch.setattr(training.trainers, "load_policy", refuse)
    monkeypatch.setattr(training.trainers, "load_processing_class", refuse)
    monkeypatch.setattr(training.online_grpo, "online_rewards", refuse)  # the reward embedder is a model too


def test_group_size_below_two_is_refused(tmp_path):
    kb = _kb_yaml(tmp_path / "kb.yaml", tmp_path / "idx")
    q = _questions(tmp_path / "q.jsonl", [GOLD_QUESTION])
    with pytest.raises(ValueError, match=r"`num_generations` \(1\) must be >= 2"):
        load_config("grpo", RECIPE, _args(tmp_path, kb, q, "--num_generations", "1"))


def test_a_question_without_gold_steps_is_refused_while_step_rewards_need_them(tmp_path, no_model):
    from training.online_grpo import build_online_grpo_trainer

    kb = _kb_yaml(tmp_path / "kb.yaml", tmp_path / "idx")
    q = _questions(tmp_path / "q.jsonl", [GOLD_QUESTION, PLAIN_QUESTION])
    cfg = load_config("grpo", RECIPE, _args(tmp_path, kb, q))
    with pytest.raises(
        ValueError, match=r"1 question\(s\) have no gold steps \(e\.g\. \['demo-1'\]\).*allow_outcome_only"
    ):
        build_online_grpo_trainer(cfg)
    # allowed explicitly, they load (outcome only) and the build goes on to the model
    cfg = load_config("grpo", RECIPE, _args(tmp_path, kb, q, "--online_rollout",
                                            f"{{kb: {kb}, allow_outcome_only: true}}"))  # fmt: skip
    with pytest.raises(AssertionError, match="a model was loaded"):
        build_online_grpo_trainer(cfg)


def test_online_settings_are_checked_when_the_recipe_loads(tmp_path):
    kb = _kb_yaml(tmp_path / "kb.yaml", tmp_path / "idx")
    q = _questions(tmp_path / "q.jsonl", [GOLD_QUESTION])
    with pytest.raises(ValueError, match=r"unknown `online_rollout` keys \['max_stpes'\]"):
        load_config("grpo", RECIPE, _args(tmp_path, kb, q, "--online_rollout", f"{{kb: {kb}, max_stpes: 2}}"))
    with pytest.raises(ValueError, match=r"discount must be in \[0, 1\]"):
        load_config("grpo", RECIPE, _args(tmp_path, kb, q, "--online_rollout", f"{{kb: {kb}, discount: 1.5}}"))
    with pytest.raises(ValueError, match=r"must be a multiple of `num_generations`"):
        load_config("grpo", RECIPE, _args(tmp_path, kb, q, "--per_device_train_batch_size", "3"))
    with pytest.raises(ValueError, match=r"`online_rollout` is set but `online` is false"):
        load_config("grpo", RECIPE, _args(tmp_path, kb, q, "--online", "false"))
    with pytest.raises(ValueError, match=r"`screen_prompts` screens step prompts .* Set `screen_prompts: false`"):
        load_config("grpo", RECIPE, _args(tmp_path, kb, q, "--screen_prompts", "true"))
    with pytest.raises(
        ValueError,
        match=r"q.jsonl:1: KB 'wiki' is neither the name nor the display name of a "
        r"configured KB \(names \['text', 'table'\]",
    ):
        from agent.kbs import kb_configs
        from training.online_grpo import question_from_row

        bad = {**GOLD_QUESTION, "gold_steps": [{"sub_question": "x?", "kb": "wiki", "answer": "y"}]}
        question_from_row(bad, kb_configs(kb), "q.jsonl:1")


def test_gold_steps_carry_display_names_from_trajectories_and_question_rows_into_the_route_reward(tmp_path):
    """A trajectory names its KB by name, a question row by either: gold steps, rows and reward see display names."""
    from agent.kbs import kb_configs
    from agent.types import Step, Trajectory
    from training.online_grpo import question_from_row, tree_rows
    from training.rewards import get_route_reward
    from training.rollouts import Generated, Sibling, StepState, StepTree, TreeStats

    kbs = kb_configs(_kb_yaml(tmp_path / "kb.yaml", tmp_path / "idx"))  # reads the YAML; builds no index
    traj = Trajectory("t#0", "Q?", steps=(Step(0, sub_question="s0?", kb="table", answer="a0"), Step(1)),
                      final_answer="A", stop_reason="answered", gold=("A",))  # fmt: skip
    from_traj = question_from_row(traj.to_dict(), kbs, "t.jsonl:1")
    assert [g.kb for g in from_traj.gold_steps] == ["Table Retriever"]  # the trajectory's KB name, mapped
    row = {**GOLD_QUESTION, "gold_steps": [{"sub_question": "s0?", "kb": "text", "answer": "a0"},  # a name
                                           {"sub_question": "s1?", "kb": "table retriever", "answer": "a1"}]}  # fmt: skip
    q = question_from_row(row, kbs, "q.jsonl:1")
    assert [g.kb for g in q.gold_steps] == ["Text Retriever", "Table Retriever"]  # display names as configured

    names = [c.display_name for c in kbs]
    anchor = StepState(0, "plan", limit=2)
    sibs = [[Sibling(anchor, Generated([1], [2], "x"), None, steps_after=0, outcome=0.0)] * 2]
    rows = tree_rows(StepTree([q], [anchor], [[{"role": "user", "content": "p"}]], sibs, TreeStats()), names, 0.5)
    plan = "<think>t</think><sub-question>s0?</sub-question><ret>{}</ret>"
    route = get_route_reward()(
        [plan.format("Text Retriever"), plan.format("Table Retriever")],
        **{k: [r[k] for r in rows] for k in ("step_type", "gold_kb", "kb_names")},
    )
    assert route == [1.0, 0.0]  # the gold step's display name is what `<ret>` is compared with


def test_rows_put_gold_steps_by_position_and_discount_the_outcome():
    """Tree → rows without a model: gold step k scores the plan after k searches; outcome γ^d."""
    from training.online_grpo import tree_rows
    from training.rollouts import Generated, GoldStep, OnlineQuestion, Sibling, StepState, StepTree, TreeStats

    q = OnlineQuestion("q", "Q?", ("A",), (), (GoldStep("s0?", "Text Retriever", "a0"),))
    plan0, ans0 = StepState(0, "plan", limit=2), StepState(0, "answer", (), "s0?", "Text Retriever", (), 2)
    plan1, final = StepState(0, "plan", (("s0?", "a0"),), limit=2), StepState(0, "final", (("s0?", "a0"),), limit=2)
    gen = Generated([1, 2], [3], "x")
    anchors = [plan0, ans0, plan1, final]
    sibs = [[Sibling(a, gen, None, steps_after=d, outcome=o) for d, o in ((3, 1.0), (1, 0.0))] for a in anchors]
    rows = tree_rows(StepTree([q], anchors, [[{"role": "user", "content": "p"}]] * 4, sibs, TreeStats()),
                     ["Text Retriever", "Table Retriever"], discount=0.5)  # fmt: skip
    assert [r["step_type"] for r in rows] == ["plan"] * 2 + ["answer"] * 2 + ["plan"] * 2 + ["final"] * 2
    assert (rows[0]["gold_sub_question"], rows[0]["gold_kb"]) == ("s0?", "Text Retriever")
    assert rows[2]["gold_answers"] == ["a0"] and rows[2]["has_gold"]
    assert (rows[4]["gold_sub_question"], rows[4]["gold_kb"], rows[4]["has_gold"]) == (None, None, True)  # gold stop
    assert rows[6]["gold_answers"] == ["A"]
    assert [r["outcome_return"] for r in rows[:2]] == [0.125, 0.0]


def test_step_tree_follows_the_agent_loop_and_bounds_the_look_ahead(tmp_path):
    """Tree logic over the real demo KB with scripted step outputs (the policy's part is the scenario above)."""
    from agent.kbs import load_knowledge_bases
    from training.rollouts import Generated, OnlineQuestion, OnlineSettings, RetrievalFailed, StepTreeRollout

    kbs = load_knowledge_bases(str(_kb_yaml(tmp_path / "kb.yaml", tmp_path / "idx")))
    plan = "<think>t</think><sub-question>Which series has companion books?</sub-question><ret>Text Retriever</ret>"
    reply = {"plan": plan, "answer": "<think>t</think><answer>Animorphs</answer>",
             "final": "<think>t</think><answer>Animorphs</answer>"}  # fmt: skip
    calls = []

    def generate(prompts, n):
        calls.append((len(prompts), n))
        firsts = [p[0]["content"] for p in prompts]  # the system prompt tells the step type
        kinds = ["final" if c.startswith("You give the final") else "plan" if c.startswith("You answer questions")
                 else "answer" for c in firsts]  # fmt: skip
        return [Generated([1], [2], reply[k]) for k in kinds for _ in range(n)]

    q = OnlineQuestion("demo-0", GOLD_QUESTION["question"], ("Animorphs",))
    tree = StepTreeRollout(generate, kbs, OnlineSettings(kb="x", max_steps=2, discount=0.5)).build([q], 2)
    assert [a.phase for a in tree.anchors] == ["plan", "answer", "plan", "answer", "final"]
    assert tree.anchors[1].hits and tree.anchors[1].kb == "Text Retriever"
    first = tree.siblings[0][0]  # plan 0 -> answer, plan, answer, final after it
    assert (first.steps_after, first.outcome) == (4, 1.0)
    assert [sb.steps_after for group in tree.siblings for sb in group] == [4, 4, 3, 3, 2, 2, 1, 1, 0, 0]
    assert len(calls) == 5 + 1 + 5  # spine levels, the branch level, continuation levels: a fixed count
    bounded = StepTreeRollout(generate, kbs, OnlineSettings(kb="x", max_steps=2, lookahead=0)).build([q], 2)
    assert [sb.steps_after for group in bounded.siblings for sb in group] == [2, 2, 1, 1, 2, 2, 1, 1, 0, 0]

    class Down:
        def search(self, queries, k):
            raise ConnectionError("retrieval service at http://127.0.0.1:1 did not answer after 2 attempts")

    from dataclasses import replace

    broken = {name: replace(kb, retriever=Down()) for name, kb in kbs.items()}
    with pytest.raises(RetrievalFailed, match="search on KB 'text' failed during a rollout: retrieval service"):
        StepTreeRollout(generate, broken, OnlineSettings(kb="x", max_steps=1)).build([q], 2)


def test_persistent_zero_std_groups_and_tag_violations_warn(caplog):
    from training.online_grpo import OnlineRun
    from training.rollouts import OnlineSettings

    run = OnlineRun(OnlineSettings(kb="x", collapse_window=3), {}, [], [])
    for step, (zero, bad) in enumerate([(1.0, 0.9), (0.95, 0.2), (1.0, 0.8)]):
        run._watch(zero, bad, step)
    assert "zero reward std for 3 steps" in caplog.text
    assert "tag-violation" not in caplog.text  # one step under the threshold breaks the streak
    for step in range(3):
        run._watch(0.0, 0.9, 10 + step)
    assert "tag-violation rate >= 50% for 3 steps" in caplog.text
