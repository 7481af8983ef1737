"""The route prior (`agent.routing`, `agent.route_prior`): fusion, KB profiles, the loop's use of it, and the
transformers backend's continuation scores it reads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from agent.kbs import load_knowledge_bases
from agent.loop import AgentConfig, StepAgent
from agent.routing import AUTO_WEIGHT, PROFILE_FILE, SIZE_PRIOR, RoutePrior, fuse, kb_profile, normalized
from agent.types import Question, Trajectory
from tests.fakes import ScriptedPolicy, last_user_text, system_text

TEXT_DOCS = ["Paris is the capital and largest city of France.", "Berlin is the capital of Germany."]
CLIP_DOCS = [
    "Shot 1: Sinbad stands between two chained, roaring lions in front of a stone archway.",
    "Shot 2: a giant bird attacks a sailing ship at sea; a sailor cries for help.",
]


def _kb_file(tmp_path: Path) -> Path:
    entries = []
    for name, display, docs in (("wiki", "Text Retriever", TEXT_DOCS), ("clips", "Clip Retriever", CLIP_DOCS)):
        corpus = tmp_path / f"{name}.jsonl"
        corpus.write_text("".join(json.dumps({"id": f"{name}{i}", "contents": d}) + "\n" for i, d in enumerate(docs)))
        entries.append({"name": name, "display_name": display, "kind": "text", "search": "bm25",
                        "corpus": str(corpus), "index_dir": str(tmp_path / f"idx-{name}"), "k": 2})  # fmt: skip
    path = tmp_path / "kbs.yaml"
    path.write_text(yaml.safe_dump({"knowledge_bases": entries}))
    return path


@pytest.fixture
def kbs(tmp_path):
    return load_knowledge_bases(_kb_file(tmp_path))


def test_fuse_keeps_a_confident_policy_and_follows_a_clear_affinity():
    logprobs = {"Text": math.log(0.7), "Clip": math.log(0.3)}
    assert fuse(logprobs, {"Text": 0.50, "Clip": 0.52}, weight=10) == "Text"  # 0.02 of cosine is 0.2 nats < 0.85
    assert fuse(logprobs, {"Text": 0.40, "Clip": 0.60}, weight=10) == "Clip"  # 2 nats > 0.85
    assert fuse(logprobs, {"Text": 0.40, "Clip": 0.60}, weight=1) == "Text"  # a small weight leaves the policy
    assert fuse(logprobs, {"Clip": 0.1}, weight=10) == "Clip"  # only KBs with an affinity are candidates
    with pytest.raises(ValueError, match="at least one KB"):
        fuse(logprobs, {"Image": 0.9}, weight=10)


def test_normalized_log_probs_sum_to_one_and_keep_their_order():
    out = normalized([-3.0, -1.0, -2.0])
    assert math.isclose(sum(math.exp(x) for x in out), 1.0)
    assert sorted(range(3), key=out.__getitem__) == [0, 2, 1]


def test_profile_is_cached_in_the_index_folder_and_recomputed_when_the_docs_change(kbs, tmp_path):
    prior = RoutePrior(kbs, weight=10)
    clip = kbs["Clip Retriever"]
    path = tmp_path / "idx-clips" / PROFILE_FILE
    assert path.is_file()
    assert prior.profiles["Clip Retriever"].shape == (2, prior.encoder.dim)

    class NoEncode:  # a cached profile is read back without encoding anything
        name = prior.encoder.name

        def encode(self, texts, progress=False):
            raise AssertionError("encoded again")

    assert np.array_equal(kb_profile(clip, NoEncode()), prior.profiles["Clip Retriever"])
    clip.retriever.docs.append(type(clip.retriever.docs[0])(id="clips9", text="Shot 3: a whale surfaces."))
    assert kb_profile(clip, prior.encoder).shape[0] == 3  # another doc set: encoded again


def test_affinity_is_the_best_cosine_with_each_kb(kbs):
    prior = RoutePrior(kbs, weight=10)
    (aff,) = prior.affinity(["Which animals are chained on both sides of Sinbad?"])
    assert set(aff) == {"Text Retriever", "Clip Retriever"}
    assert aff["Clip Retriever"] > aff["Text Retriever"] + 0.1


class ScoringPolicy(ScriptedPolicy):
    """Always plans a search of the Text Retriever; scores the KB names with fixed log-probs (p = 0.8 / 0.2)."""

    supports_continuation_scoring = True

    def __init__(self, script):
        super().__init__(script)
        self.scored: list[tuple[str, list[str]]] = []

    def continuation_logprobs(self, conversations, prefixes, continuations, step=None):
        assert step == "plan"
        self.scored += [(p, list(continuations)) for p in prefixes]
        table = {"Text Retriever</ret>": math.log(0.8), "Clip Retriever</ret>": math.log(0.2)}
        return [[table[c] for c in continuations] for _ in conversations]


def _script(conv):
    user = last_user_text(conv)
    if "next step" in user:
        if "Sub-question 1" in user:
            return "<think>done</think><sub-question>None</sub-question><ret>None</ret>"
        q = user.split("Original question: ", 1)[1].split("\n", 1)[0]
        return f"<think>look it up</think><sub-question>{q}</sub-question><ret>Text Retriever</ret>"
    if system_text(conv).startswith("You answer a question using the evidence"):
        return "<think>read</think><answer>" + user.split(": ", 1)[1].split("\n")[0][:30] + "</answer>"
    return "<think>so</think><answer>done</answer>"


def test_the_loop_moves_a_search_to_the_kb_whose_content_matches(kbs):
    policy = ScoringPolicy(_script)
    agent = StepAgent(policy, kbs, AgentConfig(max_steps=2, route_prior=10, constrained="off"))
    lions, paris = agent.run_batch(
        [Question("q1", "Which animals are chained next to Sinbad?"), Question("q2", "What is the capital of France?")]
    )
    step = lions.steps[0]
    assert step.kb == "clips" and step.hits[0].doc.id == "clips0"  # searched where the lions are
    assert step.route["policy_kb"] == "Text Retriever" and step.route["kb"] == "Clip Retriever"
    assert math.isclose(step.route["logprobs"]["Text Retriever"], math.log(0.8), abs_tol=1e-3)
    assert step.route["affinity"]["Clip Retriever"] > step.route["affinity"]["Text Retriever"]
    assert paris.steps[0].kb == "wiki" and paris.steps[0].route["kb"] == "Text Retriever"  # the policy's pick stands
    assert paris.steps[0].route["logprobs"] == {}  # uncontested (also the affinity's best): never scored
    assert len(policy.scored) == 1
    prefix, options = policy.scored[0]
    assert prefix.endswith("<ret>") and "Which animals" in prefix  # read after the plan's own sub-question
    assert options == ["Text Retriever</ret>", "Clip Retriever</ret>"]
    again = Trajectory.from_dict(json.loads(json.dumps(lions.to_dict())))
    assert again.steps[0].route == step.route  # the record keeps it


def test_without_a_route_prior_records_stay_as_they_were(kbs):
    agent = StepAgent(ScoringPolicy(_script), kbs, AgentConfig(max_steps=2, constrained="off"))
    (traj,) = agent.run_batch([Question("q1", "Which animals are chained next to Sinbad?")])
    assert traj.steps[0].kb == "wiki"  # the policy routes alone
    assert "route" not in traj.steps[0].to_dict()


def test_a_policy_that_cannot_score_is_refused_before_generating(kbs):
    policy = ScriptedPolicy(lambda conv: "never")
    with pytest.raises(
        ValueError, match=r"agent.route_prior is 10 but policy .*cannot score.*transformers, vl or vllm backend"
    ):
        StepAgent(policy, kbs, AgentConfig(route_prior=10))
    assert policy.calls == []
    with pytest.raises(ValueError, match="agent.route_prior must be a finite weight >= 0"):
        AgentConfig(route_prior=-1)


def test_transformers_continuation_scores_equal_one_full_forward(smollm2_dir):
    import torch

    from agent.backends.hf import TransformersPolicy

    policy = TransformersPolicy(smollm2_dir)
    conv = [{"role": "user", "content": "Where are the lions?"}]
    prefix = "<think>the clips</think>\n<sub-question>Where are the lions?</sub-question>\n<ret>"
    options = ["Text Retriever</ret>", "Clip Retriever</ret>", "None</ret>"]
    (scores,) = policy.continuation_logprobs([conv], [prefix], options, step="plan")
    tok = policy.tokenizer
    for option, score in zip(options, scores, strict=True):
        head = tok(policy.render(conv) + prefix, add_special_tokens=False)["input_ids"]
        tail = tok(option, add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            logp = policy.model(input_ids=torch.tensor([head + tail])).logits[0].float().log_softmax(-1)
        expected = sum(float(logp[len(head) - 1 + j, t]) for j, t in enumerate(tail))
        assert math.isclose(score, expected, abs_tol=1e-3), option
    assert len(set(scores)) == 3


def test_the_step_display_says_when_the_route_prior_moved_a_search():
    from rich.console import Console

    from agent.display import StepPrinter

    console = Console(record=True, width=200)
    plan = {"step": 0, "think": "t", "sub_question": "Where are the lions?", "errors": []}
    moved = {"policy_kb": "Text Retriever", "kb": "Clip Retriever"}
    StepPrinter(console)("q", "plan", {**plan, "kb": "Clip Retriever", "route": moved})
    StepPrinter(console)("q", "plan", {**plan, "kb": "Text Retriever", "route": {**moved, "kb": "Text Retriever"}})
    lines = console.export_text().splitlines()
    assert "→ Clip Retriever (the route prior moved it from Text Retriever)" in lines[1]
    assert lines[3].endswith("→ Text Retriever")


def test_auto_uses_the_prior_where_the_policy_can_score_and_routes_alone_elsewhere(kbs):
    question = [Question("q1", "Which animals are chained next to Sinbad?")]
    scoring = StepAgent(ScoringPolicy(_script), kbs, AgentConfig(max_steps=2, route_prior=None, constrained="off"))
    assert scoring.route_prior is not None and scoring.route_prior.weight == AUTO_WEIGHT
    assert scoring.run_batch(question)[0].steps[0].kb == "clips"
    plain = StepAgent(ScriptedPolicy(_script), kbs, AgentConfig(max_steps=2, route_prior=None, constrained="off"))
    assert plain.route_prior is None and plain.run_batch(question)[0].steps[0].kb == "wiki"


@pytest.mark.parametrize(
    ("flags", "expected"), [([], None), (["--route-prior", "0"], 0.0), (["--route-prior", "4"], 4.0)]
)
def test_the_cli_defaults_to_auto_and_takes_a_weight(flags, expected):
    import argparse

    from agent.cli import add_common_args, resolve_configs

    ap = argparse.ArgumentParser()
    add_common_args(ap, kb_default="configs/kb/demo.yaml")
    _, agent_cfg, _ = resolve_configs(ap.parse_args(flags))
    assert agent_cfg.route_prior == expected


def test_a_plan_the_policy_could_not_score_keeps_its_own_kb(kbs):
    """A remote policy answers None for a conversation its server could not score: that search stays where the
    policy sent it, and the record says nothing was scored."""

    class Unscored(ScoringPolicy):
        def continuation_logprobs(self, conversations, prefixes, continuations, step=None):
            super().continuation_logprobs(conversations, prefixes, continuations, step)
            return [None for _ in conversations]

    policy = Unscored(_script)
    agent = StepAgent(policy, kbs, AgentConfig(max_steps=2, route_prior=10, constrained="off"))
    (traj,) = agent.run_batch([Question("q1", "Which animals are chained next to Sinbad?")])
    assert len(policy.scored) == 1  # contested, so it was asked
    assert traj.steps[0].kb == "wiki" and traj.steps[0].route["kb"] == "Text Retriever"
    assert traj.steps[0].route["logprobs"] == {}


class TrainedRouter(ScoringPolicy):
    """A scoring policy whose adapter recorded the KB names it was trained on (`kbrouter_router.json`)."""

    trained_kb_names = frozenset({"Text Retriever", "Clip Retriever"})


def _renamed_kbs(tmp_path, names: dict[str, str]):
    path = _kb_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    for kb in data["knowledge_bases"]:
        kb["display_name"] = names.get(kb["display_name"], kb["display_name"])
    path.write_text(yaml.safe_dump(data))
    return load_knowledge_bases(path)


def test_auto_routes_by_content_when_a_kb_name_is_not_one_the_router_trained_on(tmp_path, kbs, caplog):
    question = [Question("q1", "Which animals are chained next to Sinbad?"), Question("q2", "Capital of France?")]
    known = StepAgent(TrainedRouter(_script), kbs, AgentConfig(max_steps=2, route_prior=None, constrained="off"))
    assert known.route_prior.weight == AUTO_WEIGHT and not known.route_prior.content_only  # its own names: fused

    def renamed_script(conv):  # the router writes the first listed name, as it does under names it never saw
        return _script(conv).replace("<ret>Text Retriever</ret>", "<ret>Film Archive</ret>")

    policy = TrainedRouter(renamed_script)
    other = _renamed_kbs(tmp_path, {"Text Retriever": "Encyclopedia", "Clip Retriever": "Film Archive"})
    with caplog.at_level("INFO", logger="agent.loop"):
        agent = StepAgent(policy, other, AgentConfig(max_steps=2, route_prior=None, constrained="off"))
    assert agent.route_prior.content_only and "not trained on the KB names ['Encyclopedia', 'Film Archive']" in (
        caplog.text
    )
    lions, paris = agent.run_batch(question)
    assert lions.steps[0].kb == "clips"  # the policy's own pick, and the closest content
    assert paris.steps[0].kb == "wiki" and paris.steps[0].route["policy_kb"] == "Film Archive"  # moved by content
    assert paris.steps[0].route["weight"] is None and paris.steps[0].route["logprobs"] == {}
    assert policy.scored == []  # content only reads no log-probabilities
    json.dumps(paris.to_dict(), allow_nan=False)  # the record stays plain JSON
    # a weight the user sets is kept, and a policy that does not say what it trained on keeps auto's weight
    fused = StepAgent(TrainedRouter(renamed_script), other, AgentConfig(route_prior=4, constrained="off"))
    assert fused.route_prior.weight == 4
    plain = StepAgent(ScoringPolicy(renamed_script), other, AgentConfig(route_prior=None, constrained="off"))
    assert plain.route_prior.weight == AUTO_WEIGHT


def test_the_router_card_records_and_reads_the_kb_names(tmp_path):
    from agent.backends.models import ROUTER_CARD, adapter_kb_names, write_router_card

    first, second = tmp_path / "sft", tmp_path / "grpo"
    first.mkdir()
    second.mkdir()
    assert adapter_kb_names(first) is None  # an adapter trained elsewhere says nothing
    write_router_card(first, {"Text Retriever", "Clip Retriever"})
    write_router_card(second, {"Image Retriever"}, init_adapter=first)  # a continued adapter keeps what it knew
    assert adapter_kb_names(second) == {"Text Retriever", "Clip Retriever", "Image Retriever"}
    (second / ROUTER_CARD).write_text('{"names": []}')
    with pytest.raises(ValueError, match=f"{ROUTER_CARD}: kb_names must be a list"):
        adapter_kb_names(second)


def test_the_shipped_router_records_its_training_names():
    from agent.backends.models import adapter_kb_names

    repo = Path(__file__).resolve().parents[2]
    names = {n for line in open(repo / "configs/kb/eval_cpu.yaml") if "display_name:" in line
             for n in [line.split(":", 1)[1].strip()]}  # fmt: skip
    assert adapter_kb_names(repo / "models/smollm2-kbrouter") == names  # the five eval KB names it trained under


def test_the_size_term_is_taken_off_each_kbs_best_cosine(tmp_path):
    small = [TEXT_DOCS[0], CLIP_DOCS[0]]
    large = [f"Report {i}: the committee met on day {i} and approved item {i * 7 % 11}." for i in range(40)]
    path = tmp_path / "kbs.yaml"
    entries = []
    for name, docs in (("small", small), ("large", large)):
        corpus = tmp_path / f"{name}.jsonl"
        corpus.write_text("".join(json.dumps({"id": f"{name}{i}", "contents": d}) + "\n" for i, d in enumerate(docs)))
        entries.append({"name": name, "kind": "text", "search": "bm25", "corpus": str(corpus),
                        "index_dir": str(tmp_path / f"idx-{name}"), "k": 2})  # fmt: skip
    path.write_text(yaml.safe_dump({"knowledge_bases": entries}))
    kbs = load_knowledge_bases(path)
    raw = RoutePrior(kbs, weight=10, size_prior=0)
    sized = RoutePrior(kbs, weight=10)
    assert sized.size_penalty == pytest.approx({"small": SIZE_PRIOR * math.sqrt(2 * math.log(2)),
                                                "large": SIZE_PRIOR * math.sqrt(2 * math.log(40))})  # fmt: skip
    queries = ["What did the committee approve?", "Which city is the capital of France?"]
    for before, after in zip(raw.affinity(queries), sized.affinity(queries), strict=True):
        for name in kbs:
            assert after[name] == pytest.approx(before[name] - sized.size_penalty[name], abs=1e-6)
    with pytest.raises(ValueError, match="route_prior_size"):
        AgentConfig(route_prior_size=-0.1)


def test_the_size_term_stops_a_big_kb_winning_questions_that_name_no_table(tmp_path, shared_path):
    """WikiTableQuestions questions name no table ("what is the total number of ..."): by the raw best cosine the
    text KB, 20x larger, wins most of them; the size term sends more to the tables, and a question that names a
    paragraph's subject still goes to the text KB."""
    tables_src = shared_path("table", "wtq", "tables")
    rows = [json.loads(line) for line in open(shared_path("table", "wtq", "questions.jsonl"))]
    table_ids = sorted({r["table_id"] for r in rows})[:15]
    tables = tmp_path / "tables"
    tables.mkdir()
    for t in table_ids:
        (tables / f"{t}.csv").write_bytes((tables_src / f"{t}.csv").read_bytes())
    with open(shared_path("text", "corpus.jsonl")) as f:
        passages = [json.loads(line) for line, _ in zip(f, range(300), strict=False)]
    corpus = tmp_path / "text.jsonl"
    corpus.write_text("".join(json.dumps({"id": p["doc_id"], "title": p["title"], "contents": p["text"]}) + "\n"
                              for p in passages))  # fmt: skip
    path = tmp_path / "kbs.yaml"
    path.write_text(yaml.safe_dump({"knowledge_bases": [
        {"name": "text", "kind": "text", "search": "bm25", "corpus": str(corpus), "index_dir": str(tmp_path / "i1")},
        {"name": "tables", "kind": "table", "search": "bm25", "corpus": str(tables), "index_dir": str(tmp_path / "i2")},
    ]}))  # fmt: skip
    kbs = load_knowledge_bases(path)
    questions = [r["question"] for r in rows if r["table_id"] in table_ids][:40]
    raw, sized = RoutePrior(kbs, weight=10, size_prior=0), RoutePrior(kbs, weight=10)
    to_tables = [sum(a["tables"] > a["text"] for a in p.affinity(questions)) for p in (raw, sized)]
    print("table questions routed to the tables, raw vs sized:", to_tables, "of", len(questions))
    assert to_tables[1] > to_tables[0]
    named = [f"What is {p['title']}?" for p in passages[:20]]
    assert all(a["text"] > a["tables"] for a in sized.affinity(named))
