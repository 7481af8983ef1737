"""Constrained decoding of the step format: the grammar, its bounds, and >= 1,000 sampled steps that all parse.

The sampling test uses SmolLM2's real tokenizer twice: with a tiny randomly initialised model (temperature 1 over
near-uniform logits: every token the grammar allows gets drawn, multi-byte pieces included, the hardest case for a
grammar) and with the real SmolLM2 weights.
"""

import random
import string

import pytest
import yaml

from agent.backends.base import SamplingParams
from agent.loop import AgentConfig, StepAgent, use_constrained
from agent.protocol import (
    answer_grammar,
    check_display_name,
    parse_answer,
    parse_plan,
    plan_grammar,
    route_grammar,
)
from agent.protocol.prompts import answer_messages, plan_messages
from agent.types import Question
from tests.fakes import FakeRetriever, ScriptedPolicy

NAME_CHARS = string.ascii_letters + string.digits + " -'&,.()/:+éüßøłñ"


def random_kb_names(rng: random.Random) -> tuple[str, ...]:
    names: list[str] = []
    while len(names) < rng.randint(1, 6):
        name = rng.choice(string.ascii_letters) + "".join(rng.choice(NAME_CHARS) for _ in range(rng.randint(0, 24)))
        name = name.strip()
        if name.lower() not in {n.lower() for n in names} and name.strip(".").lower() not in {"none", "null", "n/a"}:
            names.append(name)
    return tuple(names)


def yaml_kb_names(tmp_path) -> tuple[str, ...]:
    """KB names that exist only in a YAML file this test writes (read back through yaml, as configs are)."""
    path = tmp_path / "kbs.yaml"
    path.write_text(yaml.safe_dump({"knowledge_bases": [
        {"name": "lab_notes", "display_name": "Lab Notebook Scans (2019-2023)"},
        {"name": "recipes", "display_name": "Grand-mère's Recipes"},
    ]}))  # fmt: skip
    return tuple(kb["display_name"] for kb in yaml.safe_load(path.read_text())["knowledge_bases"])


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="module")
def random_model(tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def _sample(model, tokenizer, prompts: list[str], grammar, seed: int):
    from agent.backends.hf import generate_completions

    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    params = SamplingParams(max_new_tokens=grammar.max_tokens, temperature=1.0, seed=seed, grammar=grammar.ebnf)
    return generate_completions(model, tokenizer, enc, params)


def _check(outs, grammar, parse) -> int:
    for out in outs:
        parsed = parse(out.text)
        assert parsed.ok, (parsed.errors, out.text)
        assert out.finish_reason == "stop" and out.completion_tokens <= grammar.max_tokens, out
    return len(outs)


def test_thousand_sampled_steps_parse_over_random_kb_sets(tokenizer, random_model, tmp_path):
    rng = random.Random(0)
    kb_sets = [random_kb_names(rng) for _ in range(9)] + [yaml_kb_names(tmp_path)]
    n = plans_ask = 0
    for i, names in enumerate(kb_sets):
        kbs = [(name, "") for name in names]
        budget = rng.choice([160, 192])  # a random model fills every field: short budgets keep the test fast
        g = plan_grammar(names, budget)
        prompt = tokenizer.apply_chat_template(plan_messages("Who wrote it?", [], kbs), tokenize=False,
                                               add_generation_prompt=True)  # fmt: skip
        outs = _sample(random_model, tokenizer, [prompt] * 64, g, seed=i)
        n += _check(outs, g, lambda t, names=names: parse_plan(t, names))
        parsed = [parse_plan(o.text, names) for o in outs]
        plans_ask += sum(p.kb is not None for p in parsed)
        assert {p.kb for p in parsed if p.kb} <= set(names)
        g = answer_grammar(rng.choice([72, 96]))
        prompt = tokenizer.apply_chat_template(answer_messages("Who wrote it?", []), tokenize=False,
                                               add_generation_prompt=True)  # fmt: skip
        n += _check(_sample(random_model, tokenizer, [prompt] * 48, g, seed=100 + i), g, parse_answer)
    assert n >= 1000
    assert plans_ask > 0


def test_sampled_one_shot_routes_are_exactly_one_kb_or_none(tokenizer, random_model, tmp_path):
    """The one-shot router baseline's grammar (`eval.methods.router`): at temperature 1 every reply is
    `<ret>NAME</ret>` with NAME a configured display name or None, over random KB sets and a YAML-only one."""
    from eval.methods import ROUTER_SYSTEM, parse_route

    rng = random.Random(1)
    chosen: set[str] = set()
    for i, names in enumerate([random_kb_names(rng) for _ in range(4)] + [yaml_kb_names(tmp_path)]):
        g = route_grammar(names)
        system = ROUTER_SYSTEM.format(kb_list="\n".join(f"- {n}" for n in names), example=names[0])
        prompt = tokenizer.apply_chat_template([{"role": "system", "content": system},
                                                {"role": "user", "content": "Question: who wrote it?"}],
                                               tokenize=False, add_generation_prompt=True)  # fmt: skip
        for out in _sample(random_model, tokenizer, [prompt] * 24, g, seed=200 + i):
            inside = out.text.removeprefix("<ret>").removesuffix("</ret>")
            assert out.text == f"<ret>{inside}</ret>" and inside in (*names, "None"), out.text
            assert out.finish_reason == "stop" and out.completion_tokens <= g.max_tokens
            assert parse_route(out.text, names) == (None if inside == "None" else inside)
            chosen.add(inside)
    assert len(chosen) > 2  # temperature 1 reaches several branches, not one memorised reply


def test_real_smollm2_sampled_steps_parse(tokenizer, smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    names = ("Text Retriever", "Table Retriever", "Image Retriever")
    g = plan_grammar(names, 160)
    prompt = tokenizer.apply_chat_template(
        plan_messages("Which river flows through the capital of the country where Mozart was born?", [],
                      [(n, "") for n in names]), tokenize=False, add_generation_prompt=True)  # fmt: skip
    outs = _sample(model, tokenizer, [prompt] * 16, g, seed=0)
    _check(outs, g, lambda t: parse_plan(t, names))
    stop = _sample(model, tokenizer, [prompt.replace("Which river", "Is it true that the river")] * 8, g, seed=1)
    _check(stop, g, lambda t: parse_plan(t, names))


def test_grammar_bounds_and_budget_errors():
    g = plan_grammar(("Text Retriever",), 448)
    assert g.max_tokens <= 448 and g.limits["think_chars"] >= 60 and g.limits["sub_question_chars"] >= 90
    assert '"Text Retriever"' in g.ebnf and "None" in g.ebnf
    assert answer_grammar(256).max_tokens <= 256
    with pytest.raises(ValueError, match=r"raise it to at least \d+ \(agent.plan_tokens\)"):
        plan_grammar(("Text Retriever",), 60)
    with pytest.raises(ValueError, match="agent.answer_tokens"):
        answer_grammar(30)


@pytest.mark.parametrize("name, match", [
    ("", "empty"), ("  ", "empty"), ("Text <Retriever>", "cannot appear inside <ret>"), ("a\nb", "cannot appear"),
    ("None", "reads as 'None'"), ('say "hi"', "cannot appear"),
])  # fmt: skip
def test_display_names_the_grammar_cannot_express_are_rejected(name, match):
    with pytest.raises(ValueError, match=match):
        check_display_name(name)


def test_kb_config_with_bad_display_name_fails_at_load_naming_the_kb(tmp_path):
    from agent.kbs import load_knowledge_bases

    corpus = tmp_path / "p.jsonl"
    corpus.write_text('{"id": "1", "title": "t", "text": "some text"}\n')
    kb = tmp_path / "kb.yaml"
    kb.write_text(yaml.safe_dump({"knowledge_bases": [{"name": "notes", "display_name": "<notes>", "kind": "text",
                                                       "corpus": str(corpus), "search": "bm25"}]}))  # fmt: skip
    with pytest.raises(ValueError, match=r"knowledge base 'notes'.*display_name '<notes>'"):
        load_knowledge_bases(str(kb), build=False)


def test_constrained_on_without_structured_output_fails_before_generation():
    policy = ScriptedPolicy(lambda c: "unused")
    kbs = {"Text Retriever": _kb()}
    with pytest.raises(ValueError, match="has no structured output. Fix:"):
        StepAgent(policy, kbs, AgentConfig(constrained="on"))
    assert policy.calls == []
    assert use_constrained("auto", policy) is False


def test_agent_sends_the_grammar_and_records_render_settings():
    from tests.fakes import RecordsParams

    class GrammarPolicy(RecordsParams, ScriptedPolicy):
        pass

    def script(conv):
        if "next step" in str(conv[-1]["content"]):
            return "<think>t</think>\n<sub-question>None</sub-question>\n<ret>None</ret>"
        return "<think>t</think>\n<answer>x</answer>"

    policy = GrammarPolicy(script)
    agent = StepAgent(policy, {"Text Retriever": _kb()}, AgentConfig())
    t = agent.run_batch([Question(id="a", question="q")])[0]
    seen = policy.params
    assert t.stop_reason == "answered" and t.metadata["render"] == {
        "few_shot": False,
        "evidence_chars": 1200,
        "evidence_focus": "head",
        "constrained": True,
    }
    assert all(p.grammar and not p.stop for p in seen)
    assert '"Text Retriever"' in seen[0].grammar  # the plan grammar lists the configured KBs


def test_kbrouter_serve_accepts_the_grammar_fields():
    from fastapi.testclient import TestClient

    from agent.server import create_app

    seen = []

    class Echo:
        name, supports_grammar = "echo", True

        def generate(self, conversations, params):
            from agent.backends.base import Completion

            seen.append(params.grammar)
            return [Completion(text="<think>t</think>\n<answer>a</answer>") for _ in conversations]

    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with TestClient(create_app(Echo())) as client:
        for extra in ({"structured_outputs": {"grammar": 'root ::= "a"'}}, {"ebnf": 'root ::= "a"'},
                      {"grammar": 'root ::= "a"'}):  # fmt: skip
            assert client.post("/v1/chat/completions", json={**body, **extra}).status_code == 200
        bad = client.post("/v1/chat/completions", json={**body, "structured_outputs": {"json": {}}})
        assert bad.status_code == 400 and "json" in bad.json()["detail"]
    assert seen == ['root ::= "a"'] * 3


def test_openai_policy_sends_the_configured_field():
    from agent.backends.openai_compat import GRAMMAR_FIELDS, OpenAICompatiblePolicy

    assert GRAMMAR_FIELDS["vllm"]("g") == {"structured_outputs": {"grammar": "g"}}
    assert GRAMMAR_FIELDS["sglang"]("g") == {"ebnf": "g"} and GRAMMAR_FIELDS["llamacpp"]("g") == {"grammar": "g"}
    assert OpenAICompatiblePolicy("http://127.0.0.1:9/v1", "m", grammar_field="none").supports_grammar is False
    with pytest.raises(ValueError, match="grammar_field 'xml' is unknown"):
        OpenAICompatiblePolicy("http://127.0.0.1:9/v1", "m", grammar_field="xml")


def _kb():
    from agent.kbs import KnowledgeBase

    return KnowledgeBase(name="text", display_name="Text Retriever", retriever=FakeRetriever("text", ["a b"]))


def test_min_steps_drops_the_stop_branch_until_then():
    assert "stop" not in plan_grammar(("Text Retriever",), 448, allow_stop=False).ebnf.split("\n")[0]
    seen = []

    class GrammarPolicy(ScriptedPolicy):
        supports_grammar = True

        def generate(self, conversations, params):
            seen.append(params.grammar)
            return super().generate(conversations, params)

    def script(conv):
        if "next step" in str(conv[-1]["content"]):
            return "<think>t</think>\n<sub-question>a?</sub-question>\n<ret>Text Retriever</ret>"
        return "<think>t</think>\n<answer>x</answer>"

    StepAgent(GrammarPolicy(script), {"Text Retriever": _kb()}, AgentConfig(max_steps=2, min_steps=1)).run_batch(
        [Question(id="a", question="q")])  # fmt: skip
    plans = [g for g in seen if "sub-question" in g]
    assert "(ask | stop)" not in plans[0] and "(ask | stop)" in plans[1]
    with pytest.raises(ValueError, match="min_steps must be in"):
        AgentConfig(max_steps=1, min_steps=2)
