"""The step-protocol parser: table-driven cases and a 10,000-output fuzz run."""

import random

import pytest

from agent.protocol import FORMAT_ERRORS, parse_answer, parse_plan, ret_content, ret_span, strip_tags

KBS = ["Text Retriever", "Table Retriever", "Image Retriever"]

PLAN_CASES = [
    # well-formed: KB matched case-insensitively, display name returned as configured
    (
        "<think>t</think><sub-question>Who is X?</sub-question><ret>text retriever</ret>",
        "Who is X?",
        "Text Retriever",
        (),
    ),
    # tags themselves are case-insensitive, contents keep their case
    (
        "<THINK>t</THINK><Sub-Question>Who is X?</Sub-Question><RET>Table Retriever</RET>",
        "Who is X?",
        "Table Retriever",
        (),
    ),
    # text outside the tags is tolerated
    (
        "Sure! <think>t</think> ok <sub-question>q</sub-question>\n<ret> Image Retriever </ret> done",
        "q",
        "Image Retriever",
        (),
    ),
    # None / None ends retrieval
    ("<think>enough</think><sub-question>None</sub-question><ret>None</ret>", None, None, ()),
    # lower-case none with a period is still None
    ("<think>enough</think><sub-question>none.</sub-question><ret>none</ret>", None, None, ()),
    # unknown KB
    ("<think>t</think><sub-question>q</sub-question><ret>Web Search</ret>", "q", None, ("unknown_kb",)),
    # several KBs where one is allowed
    (
        "<think>t</think><sub-question>q</sub-question><ret>Text Retriever, Table Retriever</ret>",
        "q",
        None,
        ("multiple_kbs",),
    ),
    # a KB given with a None sub-question
    (
        "<think>t</think><sub-question>None</sub-question><ret>Text Retriever</ret>",
        None,
        "Text Retriever",
        ("kb_without_sub_question",),
    ),
    # a sub-question without a KB
    ("<think>t</think><sub-question>q</sub-question><ret>None</ret>", "q", None, ("sub_question_without_kb",)),
    # missing tags
    ("<think>t</think><ret>Text Retriever</ret>", None, "Text Retriever", ("missing_sub_question",)),
    ("<sub-question>q</sub-question><ret>Text Retriever</ret>", "q", "Text Retriever", ("missing_think",)),
    ("<think>t</think><sub-question>q</sub-question>", "q", None, ("missing_ret",)),
    # empty tags
    (
        "<think>t</think><sub-question>  </sub-question><ret>Text Retriever</ret>",
        None,
        "Text Retriever",
        ("empty_sub_question",),
    ),
    ("<think>t</think><sub-question>q</sub-question><ret></ret>", "q", None, ("empty_ret",)),
    # an opening tag never closed
    (
        "<think>t</think><sub-question>q<ret>Text Retriever</ret>",
        None,
        "Text Retriever",
        ("unclosed_tag", "missing_sub_question"),
    ),
    # a tag that must appear once appears twice: first one wins, error named
    (
        "<think>a</think><think>b</think><sub-question>q</sub-question><ret>Text Retriever</ret>",
        "q",
        "Text Retriever",
        ("repeated_tag",),
    ),
]


@pytest.mark.parametrize("text,sub_q,kb,errors", PLAN_CASES)
def test_parse_plan(text, sub_q, kb, errors):
    p = parse_plan(text, KBS)
    assert p.sub_question == sub_q
    assert p.kb == kb
    assert set(p.errors) == set(errors)
    assert p.ok == (not errors)


ANSWER_CASES = [
    ("<think>because</think><answer>Paris</answer>", "Paris", ()),  # well-formed
    ("<answer> 42 </answer>", "42", ("missing_think",)),  # think missing
    ("<think>x</think><answer></answer>", None, ("empty_answer",)),  # empty answer
    ("<think>x</think>Paris", None, ("missing_answer",)),  # no answer tag
    ("<think>x<answer>Paris</answer>", "Paris", ("missing_think", "unclosed_tag")),  # think never closed
]


@pytest.mark.parametrize("text,answer,errors", ANSWER_CASES)
def test_parse_answer(text, answer, errors):
    a = parse_answer(text)
    assert a.answer == answer
    assert set(a.errors) == set(errors)


def test_non_string_output_is_a_named_error():
    # a backend returning None or bytes must not crash the loop
    assert parse_plan(None, KBS).errors == ("not_text",)
    assert parse_answer(b"<answer>x</answer>").errors == ("not_text",)


def _mutate(rng: random.Random, text: str) -> str:
    ops = [
        lambda s: s[: rng.randrange(len(s) + 1)],  # truncate
        lambda s: s.replace(rng.choice(["<", ">", "/"]), "", 1),  # break a tag
        lambda s: s.upper() if rng.random() < 0.5 else s.lower(),
        lambda s: s + rng.choice(["<think>", "</ret>", "<answer>", "<sub-question>"]),
        lambda s: s.replace("Text Retriever", rng.choice(["Txt", "None", "Table Retriever, Text Retriever", ""])),
        lambda s: "".join(rng.sample(s, len(s))) if len(s) < 80 else s[::-1],
        lambda s: s.replace("</think>", "</think>" * rng.randint(0, 3)),
        lambda s: s + "".join(chr(rng.randrange(0, 0x2FFF)) for _ in range(rng.randint(0, 30))),
    ]
    for _ in range(rng.randint(1, 4)):
        text = rng.choice(ops)(text)
    return text


def test_fuzz_10000_outputs_never_raise_and_every_failure_is_named():
    rng = random.Random(0)
    seeds = [c[0] for c in PLAN_CASES] + [c[0] for c in ANSWER_CASES]
    n_fail = 0
    for i in range(10_000):
        if i % 5 == 0:  # fully random strings, including tag-like noise
            alphabet = "<>/ abcdefghijklmnopqrstuvwxyz-thinkretanswersubquestion\n"
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))
        else:
            text = _mutate(rng, rng.choice(seeds))
        p, a = parse_plan(text, KBS), parse_answer(text)
        for parsed in (p, a):
            assert all(e in FORMAT_ERRORS for e in parsed.errors), parsed.errors
        if p.ok:  # a well-formed plan is internally consistent
            assert (p.sub_question is None) == (p.kb is None)
            assert p.kb is None or p.kb in KBS
        else:
            n_fail += 1
        if a.ok:
            assert a.answer
    assert n_fail > 5_000  # the mutations really produced malformed outputs


def test_ret_content_reads_an_open_or_closed_ret_and_ret_span_only_a_closed_one():
    assert ret_content("<think>t</think><ret> Table Retriever </ret>") == " Table Retriever "
    assert ret_content("<RET>None") == "None"  # the server dropped the `</ret>` stop string
    assert ret_content("Table Retriever") is None
    text = "<ret>Text Retriever</ret>"
    start, end = ret_span(text)
    assert text[start:end] == "Text Retriever" and ret_span("<ret>Text Retriever") is None


def test_strip_tags_drops_think_blocks_and_tags():
    assert strip_tags("<think>so it is</think> <answer>Paris</answer>, <b>France</b>") == "Paris , France"
