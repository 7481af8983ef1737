"""`agent.answer_words: shown`: an answer made of the words its step was shown, one grammar per conversation.

The grammar tests sample with SmolLM2's real tokenizer over a tiny randomly initialised model at temperature 1 (every
token the grammar allows gets drawn); the backend tests run the real SmolLM2 weights and `kbrouter serve`'s app.
"""

import re

import pytest

from agent.backends.base import Completion, SamplingParams, check_grammar_rows, per_row_params, row_params
from agent.loop import AgentConfig, StepAgent
from agent.protocol import answer_grammar, answer_messages, parse_answer, shown_answer_grammars, shown_words
from agent.types import Question
from retrievers.types import Doc, Hit
from tests.agent.test_constrained import random_model, tokenizer  # noqa: F401 - module fixtures
from tests.fakes import FakeRetriever, RecordsParams, ScriptedPolicy

TABLE = (
    "The French Connection (film)\nAward | Category | Nominee | Result\n"
    "Academy Awards, 1972 | Best Director | William Friedkin | Won\n"
    "Golden Globe Awards, 1972 | Best Actor | Gene Hackman | Won"
)
PASSAGE = "Kodachrome Professional film was sold in 35 mm from 1956 to 1962, made by Eastman Kodak in Rochester."


def _hit(kb: str, text: str, modality: str = "text") -> Hit:
    return Hit(doc=Doc(id=f"{kb}-doc", text=text, kb=kb, modality=modality), score=1.0, rank=0, kb=kb)


def _answer_words(answer: str) -> list[str]:
    return [w for w in re.split(r", | ", answer) if w]


def test_shown_words_keep_the_evidence_words_and_drop_labels():
    words = shown_words("wtq-0: Academy Awards, 1972 | Best Director | William Friedkin | Won (film).", ["wtq"])
    assert {
        "Academy",
        "academy",
        "Awards",
        "Best",
        "Director",
        "William",
        "Friedkin",
        "friedkin",
        "Won",
        "film",
    } <= set(words)
    assert "wtq-0" not in words and "Awards," not in words and "(film)." not in words and "|" not in words
    assert "1972" not in words  # numbers come from the grammar's own number rule
    assert shown_words("text-3 TEXT-3 Text-12 COVID-19", ["text"]) == ("COVID-19", "covid-19")
    assert shown_words("a <b> c\x01d", ()) == ("a",)  # a tag bracket or control character never enters


def test_sampled_answers_use_only_their_own_rows_words(tokenizer, random_model):  # noqa: F811
    from agent.backends.hf import generate_completions

    evidence = [[_hit("wtq", TABLE, "table")], [_hit("wiki", PASSAGE)]]
    convs = [answer_messages("Who directed it?", h) for h in evidence]
    grammars = []
    for conv in convs:
        words = shown_words(conv[-1]["content"], ["wtq", "wiki"])
        grammars.append(answer_grammar(96, words))
    prompts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in convs]
    vocab = [set(shown_words(c[-1]["content"], ["wtq", "wiki"])) | {"yes", "no", "Yes", "No"} for c in convs]
    n = 0
    for seed in range(12):
        rows = [0, 1] * 8
        enc = tokenizer([prompts[r] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
        params = SamplingParams(max_new_tokens=grammars[0].max_tokens, temperature=1.0, seed=seed,
                                grammar=tuple(grammars[r].ebnf for r in rows))  # fmt: skip
        for r, out in zip(rows, generate_completions(random_model, tokenizer, enc, params), strict=True):
            parsed = parse_answer(out.text)
            assert parsed.ok, (parsed.errors, out.text)
            assert out.completion_tokens <= grammars[r].max_tokens
            words = _answer_words(parsed.answer)
            assert 1 <= len(words) <= grammars[r].limits["answer_words"]
            assert all(w in vocab[r] or w.isdigit() for w in words), (r, parsed.answer)
            n += 1
    assert n == 192
    assert "Friedkin" not in vocab[1] and "Kodachrome" not in vocab[0]  # the rows' vocabularies differ


def test_hf_policy_gives_each_row_its_grammar_after_sorting_and_chunking(smollm2_dir):
    from agent.backends.hf import TransformersPolicy

    policy = TransformersPolicy(smollm2_dir, max_batch_size=1)
    convs = [
        [{"role": "user", "content": "Tell me a long story about " + "the sea, " * 30}],
        [{"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Name a colour, please."}],
    ]
    grammars = tuple(f'root ::= "<answer>{w}</answer>"' for w in ("alpha", "beta", "gamma"))
    outs = policy.generate(convs, SamplingParams(max_new_tokens=16, grammar=grammars))
    assert [parse_answer(o.text, require_think=False).answer for o in outs] == ["alpha", "beta", "gamma"]
    with pytest.raises(ValueError, match="2 grammars for 3 conversations"):
        policy.generate(convs, SamplingParams(max_new_tokens=4, grammar=grammars[:2]))


def test_row_params_cuts_a_grammar_tuple_and_leaves_one_grammar_alone():
    params = SamplingParams(grammar=("a", "b", "c"))
    assert row_params(params, [2, 0]).grammar == ("c", "a")
    assert row_params(SamplingParams(grammar="g"), [5]).grammar == "g"
    check_grammar_rows(SamplingParams(grammar="g"), 7)
    with pytest.raises(ValueError, match="3 grammars for 2 conversations"):
        check_grammar_rows(params, 2)
    assert [p.grammar for p in per_row_params(params, 3)] == ["a", "b", "c"]  # one request (or key) each
    assert per_row_params(SamplingParams(grammar="g"), 2) == [SamplingParams(grammar="g")] * 2
    with pytest.raises(ValueError, match="3 grammars for 4 conversations"):
        per_row_params(params, 4)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):  # the class keeps its own checks
        SamplingParams(max_new_tokens=0, grammar=("a",))


def test_openai_policy_sends_each_request_its_own_grammar():
    from fastapi.testclient import TestClient

    from agent.backends.openai_compat import OpenAICompatiblePolicy
    from agent.server import create_app

    seen = []

    class Echo:
        name, supports_grammar = "echo", True

        def generate(self, conversations, params):
            seen.extend((c[-1]["content"], params.grammar) for c in conversations)
            return [Completion(text="<think>t</think>\n<answer>a</answer>") for _ in conversations]

    with TestClient(create_app(Echo())) as client:
        policy = OpenAICompatiblePolicy("http://testserver/v1", "served", concurrency=1)  # TestClient: one at a time
        policy._client = client  # the real app in-process: same request, no socket
        convs = [[{"role": "user", "content": q}] for q in ("one", "two", "three")]
        policy.generate(
            convs, SamplingParams(max_new_tokens=8, grammar=('root ::= "1"', 'root ::= "2"', 'root ::= "3"'))
        )
    assert sorted(seen) == [("one", 'root ::= "1"'), ("three", 'root ::= "3"'), ("two", 'root ::= "2"')]


class _GrammarPolicy(RecordsParams, ScriptedPolicy):
    pass


def _script(conv):
    if "next step" in str(conv[-1]["content"]):
        if "Answer 1" in str(conv[-1]["content"]):
            return "<think>t</think>\n<sub-question>None</sub-question>\n<ret>None</ret>"
        sub = "Kodachrome was sold when?" if "Kodachrome" in str(conv[-1]["content"]) else "who directed it?"
        return f"<think>t</think>\n<sub-question>{sub}</sub-question>\n<ret>Text Retriever</ret>"
    return "<think>t</think>\n<answer>Friedkin</answer>"


def test_agent_builds_one_answer_grammar_per_question_and_records_the_setting():
    from agent.kbs import KnowledgeBase

    docs = ["William Friedkin directed it", "Kodachrome was sold from 1956"]
    kb = KnowledgeBase(name="text", display_name="Text Retriever", retriever=FakeRetriever("text", docs))
    policy = _GrammarPolicy(_script)
    agent = StepAgent(policy, {"Text Retriever": kb}, AgentConfig(max_steps=2, top_k=1, answer_words="shown"))
    trajs = agent.run_batch([Question(id="a", question="Who directed it?"), Question(id="b", question="Kodachrome?")])
    assert all(t.metadata["render"]["answer_words"] == "shown" for t in trajs)
    answer = next(p for p in policy.params if p.step == "answer")
    final = next(p for p in policy.params if p.step == "final")
    assert isinstance(answer.grammar, tuple) and len(answer.grammar) == 2 and isinstance(final.grammar, tuple)
    assert all('"text-0"' not in g and '"text"' not in g for g in answer.grammar)  # the hit label is not a word
    hits = [t.steps[0].hits[0].doc.text for t in trajs]
    for g, text in zip(answer.grammar, hits, strict=True):
        assert all(f'"{w}"' in g for w in text.split() if not w.isdigit())
    assert any('"Friedkin"' not in g for g in answer.grammar)  # each question's own evidence, not the batch's
    assert all(p.grammar is None or isinstance(p.grammar, str) for p in policy.params if p.step == "plan")


def test_answer_words_shown_needs_a_grammar_and_a_known_value():
    from agent.kbs import KnowledgeBase

    kb = KnowledgeBase(name="text", display_name="Text Retriever", retriever=FakeRetriever("text", ["a b"]))
    policy = ScriptedPolicy(lambda c: "unused")
    with pytest.raises(ValueError, match="agent.answer_words: shown .* agent.constrained: on"):
        StepAgent(policy, {"Text Retriever": kb}, AgentConfig(answer_words="shown"))
    assert policy.calls == []
    with pytest.raises(ValueError, match=r"agent.answer_words must be one of \('free', 'shown', 'found'\)"):
        AgentConfig(answer_words="evidence")
    default = StepAgent(_GrammarPolicy(_script), {"Text Retriever": kb}, AgentConfig(max_steps=2))
    [t] = default.run_batch([Question(id="a", question="q")])
    assert "answer_words" not in t.metadata["render"]  # free: records read as before the setting existed


def test_found_gives_the_final_step_the_words_of_the_intermediate_answers():
    from agent.kbs import KnowledgeBase

    docs = ["William Friedkin directed it", "Kodachrome was sold from 1956"]
    kb = KnowledgeBase(name="text", display_name="Text Retriever", retriever=FakeRetriever("text", docs))
    policy = _GrammarPolicy(_script)
    agent = StepAgent(policy, {"Text Retriever": kb}, AgentConfig(max_steps=2, top_k=1, answer_words="found"))
    [t] = agent.run_batch([Question(id="a", question="Who directed the film?")])
    assert t.metadata["render"]["answer_words"] == "found" and t.steps[0].answer == "Friedkin"
    answer = next(p for p in policy.params if p.step == "answer")
    [final] = next(p for p in policy.params if p.step == "final").grammar
    assert '"William"' in answer.grammar[0] and '"directed"' in answer.grammar[0]
    assert '"Friedkin"' in final and '"William"' not in final and '"film"' not in final  # not the question's words
    assert "answer ::= word (sep word){0,0}" in final  # one intermediate word: a one-word final, no loop through it


def test_a_word_bound_caps_the_answer_phrase():
    words = ("Rose", "McGowan", "Charmed")
    assert answer_grammar(512, words).limits["answer_words"] == 24
    assert answer_grammar(512, words, 2).limits["answer_words"] == 2
    assert shown_answer_grammars(["Rose McGowan", "Charmed"], 512, [], [2]) == (
        answer_grammar(512, ("Rose", "rose", "McGowan", "mcgowan"), 2).ebnf,
        answer_grammar(512, ("Charmed", "charmed")).ebnf,  # no bound given: the grammar's own
    )
