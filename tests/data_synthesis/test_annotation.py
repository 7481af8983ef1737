"""The annotation teacher: gold plans from the datasets' own supervision, checked with real (BM25) retrievers over small
KBs cut from ../shared/data, rejection by gold support, skips, held-out exclusion, and step records equal to the
prompts the live loop renders when a policy writes the same steps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from agent.backends.base import Completion
from agent.loop import AgentConfig, StepAgent
from agent.step_records import kb_id
from data_synthesis.config import SynthConfig
from data_synthesis.gold_plans import NoPlan, image_sub_question, musique_question
from data_synthesis.job import load_kbs, run_synthesis
from data_synthesis.records import step_records
from data_synthesis.rejection import holds_support
from retrievers.types import Doc, Hit, Media
from tests.conftest import SHARED

ROOT = Path(__file__).resolve().parents[2]
needs_shared = pytest.mark.skipif(not (SHARED / "text" / "questions.jsonl").exists(),
                                  reason=f"shared data {SHARED} is absent (set KBROUTER_SHARED_DATA)")  # fmt: skip

# real rows of ../shared/data (none held out by data/splits/shared_heldout.json)
MUSIQUE = "musique-train-2hop__150763_14904"  # 'Who was the first president of #1 ?'
MUSIQUE_NO_SUPPORT = "musique-train-2hop__468258_495107"  # its 2nd-hop paragraph is left out of the fixture corpus
BRIDGE = "hotpotqa-train-5a77ec115542992a6e59dff7"  # Gallu / Alû / Lilu
COMPARISON = "hotpotqa-train-5ae40c465542996836b02c25"
TABLES = ["1-10932739-2.html.csv", "1-11677100-18.html.csv", "1-1341707-15.html.csv", "1-1342198-36.html.csv"]
HELD_TABLE = "1-1342198-36.html.csv"  # listed as held out in the fixture split
VIDEO_Q = "video-q001"  # lions chained beside Sinbad, 0-12 s


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in items))
    return path


def read(path: Path) -> list[dict]:
    return rows(path) if path.exists() else []


# -- pure functions ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("template", "answers", "expected"),
    [
        ("Who was the first president of #1 ?", ["American Psychological Association"],
         "Who was the first president of American Psychological Association?"),  # #1 replaced, space before ? gone
        ("#1 >> country of citizenship", ["Henrik Ibsen"], "What is the country of citizenship of Henrik Ibsen?"),
        ("Brand >> author", [], "What is the author of Brand?"),  # knowledge-graph form worded as a question
        ("Which state borders #2 to the east?", ["Tennessee", "Nashville"], "Which state borders Nashville to the east?"),
    ],
)  # fmt: skip
def test_musique_question(template, answers, expected):
    assert musique_question(template, answers) == expected


def test_musique_placeholder_without_an_earlier_hop_is_a_bad_decomposition():
    with pytest.raises(NoPlan) as e:
        musique_question("Who founded #2?", ["x"])
    assert e.value.reason == "bad_decomposition"


def _hit(hit_id: str, rank: int = 0, **meta) -> Hit:
    media = meta.pop("media", None)
    return Hit(Doc(hit_id, "text", metadata=meta, media=media), 1.0 - rank / 10, rank, "kb")


@pytest.mark.parametrize(
    ("hits", "support", "held"),
    [
        ([_hit("wiki-1#2", doc_id="wiki-1")], {"ids": ["wiki-1"], "need": "all"}, True),  # a chunk of the gold record
        ([_hit("wiki-1")], {"ids": ["wiki-1", "wiki-2"], "need": "all"}, False),  # one of two needed paragraphs
        ([_hit("wiki-2"), _hit("wiki-1", 1)], {"ids": ["wiki-1", "wiki-2"], "need": "all"}, True),
        ([_hit("wiki-3")], {"ids": ["wiki-1", "wiki-3"], "need": "any"}, True),
        ([_hit("t.html.csv")], {"ids": ["u.html.csv"]}, False),  # another table
        ([], {"ids": ["x"]}, False),  # no evidence
        # clips: a clip corpus' start/end columns, or a clip KB's media span; overlap with the gold span counts
        ([_hit("v@0-12", video_id="v", start=0.0, end=12.0)], {"video_id": "v", "span": [5.0, 20.0]}, True),
        ([_hit("v@12-28", video_id="v", start=12.0, end=28.0)], {"video_id": "v", "span": [0.0, 12.0]}, False),
        ([_hit("w@0-12", video_id="w", start=0.0, end=12.0)], {"video_id": "v", "span": [0.0, 12.0]}, False),
        ([_hit("v#001", video_id="v", media=Media("v.mp4", 10.0, 30.0))], {"video_id": "v", "span": [0, 12]}, True),
    ],
)  # fmt: skip
def test_holds_support(hits, support, held):
    assert holds_support(hits, support) is held


def test_image_sub_question_describes_the_photo_with_a_noun_phrase_caption():
    captions = ["She just finished chopping.", "A woman holding a knife in the kitchen."]
    assert image_sub_question("How many cups are there in the image?", captions) == (
        "How many cups are there in the image of a woman holding a knife in the kitchen?")  # fmt: skip


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"m": 2, "temperature": 0.7}, "one gold trajectory per question; set `m: 1`"),
        ({"m": 1, "inputs": [{"path": "q.jsonl", "format": "wtq"}]}, "set e.g. `kb: wiki`"),
        ({"m": 1, "inputs": [{"path": "s.jsonl", "format": "r1router_steps"}]}, "need `kb_map`"),
    ],
)
def test_annotation_config_errors_name_the_fix(values, message):
    with pytest.raises(ValueError, match=message):
        SynthConfig(teacher={"backend": "annotation"}, **values)


# -- one job over small real KBs ------------------------------------------------------------------------------------
def _kb_yaml(tmp: Path, corpora: dict[str, Path]) -> Path:
    kbs = [
        {"name": "wiki", "display_name": "Text Retriever", "kind": "text", "granularity": "paragraph",
         "corpus": str(corpora["wiki"]), "search": "bm25", "k": 3},
        {"name": "tabfact", "display_name": "Table Retriever", "kind": "table", "corpus": str(corpora["tabfact"]),
         "search": "bm25", "k": 3},
        {"name": "wtq", "display_name": "WikiTable Retriever", "kind": "table", "corpus": str(corpora["wtq"]),
         "search": "bm25", "k": 3},
        {"name": "coco_captions", "display_name": "Image Retriever", "kind": "text", "granularity": "document",
         "corpus": str(corpora["coco"]), "search": "bm25", "k": 3},
        {"name": "video_clips", "display_name": "Clip Retriever", "kind": "text", "granularity": "document",
         "corpus": str(corpora["video"]), "search": "bm25", "k": 3},
    ]  # fmt: skip
    for kb in kbs:
        kb["index_dir"] = str(tmp / "indexes" / kb["name"])
    path = tmp / "kbs.yaml"
    path.write_text(yaml.safe_dump({"knowledge_bases": kbs}))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Inputs and KBs cut from the shared data, a split file holding a few of them out, and one annotation run."""
    if not (SHARED / "text" / "questions.jsonl").exists():
        pytest.skip(f"shared data {SHARED} is absent (set KBROUTER_SHARED_DATA)")
    tmp = tmp_path_factory.mktemp("annotation")
    text = {r["qid"]: r for r in rows(SHARED / "text" / "questions.jsonl")}
    corpus = {r["doc_id"]: r for r in rows(SHARED / "text" / "corpus.jsonl")}
    chosen = [text[q] for q in (MUSIQUE, MUSIQUE_NO_SUPPORT, BRIDGE, COMPARISON)]
    dropped = text[MUSIQUE_NO_SUPPORT]["decomposition"][-1]["doc_id"]
    doc_ids = dict.fromkeys(d for r in chosen for d in r["context_doc_ids"] if d != dropped)
    corpora = {"wiki": write_jsonl(tmp / "wiki.jsonl", [corpus[d] for d in doc_ids])}

    bridge = text[BRIDGE]
    no_bridge = {**bridge, "qid": "hotpotqa-train-nobridge", "answers": ["no paragraph says this"]}
    no_decomposition = {k: v for k, v in text[MUSIQUE].items() if k != "decomposition"} | {"qid": "musique-nodecomp"}
    no_facts = {k: v for k, v in bridge.items() if k != "supporting_facts"} | {"qid": "hotpotqa-train-nofacts"}
    bad_hops = {**text[MUSIQUE], "qid": "musique-badhop",
                "decomposition": [{**text[MUSIQUE]["decomposition"][0], "question": "Who founded #3?"}]}  # fmt: skip
    held_text = {**text[MUSIQUE], "qid": "musique-heldout"}
    text_in = write_jsonl(tmp / "text.jsonl", [*chosen, no_bridge, no_decomposition, no_facts, bad_hops, held_text])

    tables = tmp / "tabfact_tables"
    tables.mkdir()
    for t in TABLES:
        shutil.copy(SHARED / "table" / "tabfact" / "tables" / t, tables / t)
    statements = [r for r in rows(SHARED / "table" / "tabfact" / "statements.jsonl") if r["table_id"] in TABLES]
    tab_in = write_jsonl(tmp / "tabfact.jsonl", [next(r for r in statements if r["table_id"] == t) for t in TABLES])
    corpora["tabfact"] = tables

    wtq_rows = rows(SHARED / "table" / "wtq" / "questions.jsonl")
    wtq_tables = list(dict.fromkeys(r["table_id"] for r in wtq_rows))[:5]
    corpora["wtq"] = tmp / "wtq_tables"
    corpora["wtq"].mkdir()
    for t in wtq_tables:
        for ext in (".csv", ".json"):
            shutil.copy(SHARED / "table" / "wtq" / "tables" / f"{t}{ext}", corpora["wtq"] / f"{t}{ext}")
    wtq_q = next(r for r in wtq_rows if r["qid"] == "wtq-nu-485")  # "... the film, "the french connection."?"
    wtq_in = write_jsonl(tmp / "wtq.jsonl", [wtq_q])

    images = rows(SHARED / "image" / "coco" / "images.jsonl")[:10]
    corpora["coco"] = write_jsonl(
        tmp / "coco_captions.jsonl",
        [{"id": i["image_id"], "title": f"photo {i['image_id']}", "text": " ".join(i["captions"])} for i in images],
    )
    coco_qa = [
        r
        for r in rows(SHARED / "image" / "coco" / "qa_derived.jsonl")
        if r["image_id"] in {images[0]["image_id"], images[1]["image_id"]}
    ]
    coco_dir = tmp / "coco"
    coco_dir.mkdir()
    (coco_dir / "images").symlink_to(SHARED / "image" / "coco" / "images")
    shutil.copy(SHARED / "image" / "coco" / "images.jsonl", coco_dir / "images.jsonl")
    coco_in = write_jsonl(coco_dir / "qa.jsonl", [
        next(r for r in coco_qa if r["image_id"] == images[0]["image_id"]),
        next(r for r in coco_qa if r["image_id"] == images[1]["image_id"]),  # its image is held out below
        {"qid": "coco-noimage-q0", "question": "How many dogs are there in the image?", "answer": "2"},
    ])  # fmt: skip

    clips = []
    for v in rows(SHARED / "video" / "videos.jsonl"):
        for start, end, note in v.get("shots_manual") or []:
            clips.append({"id": f"{v['video_id']}@{start:g}-{end:g}", "title": v["source_title"], "text": note,
                          "video_id": v["video_id"], "start": start, "end": end})  # fmt: skip
    corpora["video"] = write_jsonl(tmp / "video_clips.jsonl", clips)
    video_q = next(r for r in rows(SHARED / "video" / "qa.jsonl") if r["qid"] == VIDEO_Q)
    no_span = {k: v for k, v in video_q.items() if k != "evidence_span_s"} | {"qid": "video-nospan"}
    video_in = write_jsonl(tmp / "video.jsonl", [video_q, no_span])

    split = tmp / "split.json"
    split.write_text(json.dumps({"heldout": {
        "musique": {"qids": ["musique-heldout"]},
        "tabfact": {"qids": [], "tables": [HELD_TABLE]},
        "coco": {"qids": [], "images": [images[1]["image_id"]]},
    }}))  # fmt: skip
    ex = str(split)
    inputs = [
        {"path": str(text_in), "format": "shared_text", "kb": "wiki", "exclude_split": ex},
        {"path": str(tab_in), "format": "tabfact", "kb": "tabfact", "exclude_split": ex},
        {"path": str(wtq_in), "format": "wtq", "kb": "wtq", "exclude_split": ex},
        {"path": str(coco_in), "format": "coco", "kb": "coco_captions", "exclude_split": ex, "describe_image": True},
        {"path": str(video_in), "format": "video", "kb": "video_clips", "exclude_split": ex},
    ]
    cfg = SynthConfig(inputs=inputs, kb_config=str(_kb_yaml(tmp, corpora)), teacher={"backend": "annotation"}, m=1,
                      temperature=0.0, max_steps=3, top_k_hits=3, questions_per_batch=4,
                      output_dir=str(tmp / "out"), progress=False, export_format="none")  # fmt: skip
    summary = run_synthesis(cfg)
    out = tmp / "out"
    trajs = {t["metadata"]["question_id"]: t for t in read(out / "trajectories.jsonl")}
    rejected = {r["question_id"]: r for r in read(out / "rejected.jsonl")}
    return {"cfg": cfg, "out": out, "summary": summary, "accepted": trajs, "rejected": rejected,
            "skipped": {s["id"]: s for s in read(out / "skipped.jsonl")}, "steps": read(out / "steps.jsonl"),
            "text": text, "images": images, "statements": statements}  # fmt: skip


def _retrievals(traj: dict) -> list[dict]:
    return [s for s in traj["steps"] if s["sub_question"] is not None]


def _hit_ids(step: dict) -> set[str]:
    return {h["doc"]["metadata"].get("doc_id", h["doc"]["id"]) for h in step["hits"]}


@needs_shared
def test_musique_hops_substitute_earlier_answers(world):
    traj = world["accepted"][MUSIQUE]
    gold = world["text"][MUSIQUE]["decomposition"]
    steps = _retrievals(traj)
    assert [s["answer"] for s in steps] == [d["answer"] for d in gold]  # the dataset's own hop answers
    assert "#1" not in steps[1]["sub_question"] and gold[0]["answer"] in steps[1]["sub_question"]
    assert all(d["doc_id"] in _hit_ids(s) for s, d in zip(steps, gold, strict=True))  # each hop found its paragraph
    assert all(s["kb"] == "wiki" for s in steps) and traj["final_answer"] == gold[-1]["answer"]
    # 2 hops < max_steps 3: the plan ends with a stop step, as the loop's does when the policy says None
    assert traj["steps"][-1]["sub_question"] is None and traj["steps"][-1]["kb"] is None
    assert traj["stop_reason"] == "answered" and traj["metadata"]["annotation"] == "musique"
    assert gold[0]["answer"] in steps[1]["think"]  # "From step 1, I know: ..."


@needs_shared
def test_hotpotqa_bridge_and_comparison_take_two_hops(world):
    bridge = world["accepted"][BRIDGE]
    assert bridge["metadata"]["annotation"] == "hotpotqa_bridge"
    hop1, hop2 = _retrievals(bridge)
    paragraphs = {h["doc"]["id"]: h["doc"]["text"] for s in (hop1, hop2) for h in s["hits"]}
    first, second = (sup["ids"][0] for sup in bridge["metadata"]["gold_support"])
    assert {first, second} == set(world["text"][BRIDGE]["supporting_doc_ids"])
    assert hop1["answer"] in paragraphs[first]  # the bridge entity is written in the first paragraph
    assert hop1["answer"] in hop2["sub_question"] and hop2["answer"] == world["text"][BRIDGE]["answers"][0]
    assert hop1["sub_question"] == bridge["question"]  # hop 1 names nothing that only retrieval can find
    comparison = world["accepted"][COMPARISON]
    assert comparison["metadata"]["annotation"] == "hotpotqa_comparison"
    hops = _retrievals(comparison)
    assert len(hops) == 2 and hops[0]["sub_question"] != hops[1]["sub_question"]
    for hop in hops:  # each entity's answer is its supporting sentence, found in a retrieved paragraph
        assert any(hop["answer"] in h["doc"]["text"] for h in hop["hits"])


@needs_shared
def test_hotpotqa_without_a_bridge_is_one_step_with_the_question_itself(world):
    traj = (
        world["accepted"].get("hotpotqa-train-nobridge") or world["rejected"]["hotpotqa-train-nobridge"]["trajectory"]
    )
    assert traj["metadata"]["annotation"] == "hotpotqa_one_step"
    (step,) = _retrievals(traj)
    assert step["sub_question"] == traj["question"] and step["answer"] == "no paragraph says this"
    (support,) = traj["metadata"]["gold_support"]  # one step needs both paragraphs in its evidence
    assert support["need"] == "all" and sorted(support["ids"]) == sorted(world["text"][BRIDGE]["supporting_doc_ids"])


@needs_shared
@pytest.mark.parametrize(
    ("qid", "kb", "support"),
    [
        ("tabfact", "tabfact", lambda w, t: w["statements"][0]["table_id"]),  # the statement's own table
        ("wtq-nu-485", "wtq", lambda w, t: "200-11"),
        ("coco", "coco_captions", lambda w, t: w["images"][0]["image_id"]),
        (VIDEO_Q, "video_clips", lambda w, t: "popeye_sinbad_p1@0-12"),  # the clip overlapping 0-12 s
    ],
)
def test_one_step_questions_go_to_their_kb_and_find_their_support(world, qid, kb, support):
    if qid == "tabfact":
        qid = world["statements"][0]["qid"]
    if qid == "coco":
        qid = next(q for q in world["accepted"] if q.startswith(world["images"][0]["image_id"] + "-"))
    traj = world["accepted"][qid]
    (step,) = _retrievals(traj)
    assert step["kb"] == kb and support(world, traj) in {h["doc"]["id"] for h in step["hits"]}
    assert traj["final_answer"] in traj["gold"] or ", ".join(traj["gold"]) == traj["final_answer"]
    assert f"{step['hits'][0]['kb']}-" in step["answer_think"]  # names the evidence line holding the answer
    if kb == "coco_captions":  # the photo described by one of its captions; the image goes with the query
        assert step["sub_question"] != traj["question"] and traj["images"] and Path(traj["images"][0]).exists()


@needs_shared
def test_evidence_without_the_gold_support_is_rejected_and_counted(world):
    rec = world["rejected"][MUSIQUE_NO_SUPPORT]
    assert rec["reasons"] == ["missing_support"]  # the final answer is right; the 2nd hop's paragraph is not there
    by_modality = world["summary"]["by_modality"]
    assert by_modality["text"]["rejection_reasons"]["missing_support"] >= 1
    assert by_modality["text"]["accepted"] >= 3 and by_modality["table"]["accepted"] >= 1
    assert world["summary"]["accepted"] + world["summary"]["rejected"] == world["summary"]["trajectories"]
    assert MUSIQUE_NO_SUPPORT not in {r["metadata"]["question_id"] for r in world["steps"]}  # no step records


@needs_shared
def test_rows_missing_their_teachers_fields_are_skips_with_reasons(world):
    skipped = world["skipped"]
    expected = {"musique-nodecomp": "missing_fields", "hotpotqa-train-nofacts": "missing_fields",
                "musique-badhop": "bad_decomposition", "video-nospan": "missing_fields",
                "coco-noimage-q0": "missing_fields"}  # fmt: skip
    assert {q: skipped[q]["reason"] for q in expected} == expected
    assert "decomposition" in skipped["musique-nodecomp"]["detail"]
    assert "evidence_span_s" in skipped["video-nospan"]["detail"]
    assert world["summary"]["skipped_by_reason"]["missing_fields"] == 4
    assert world["summary"]["skipped_by_dataset"]["musique"] == {"missing_fields": 1, "bad_decomposition": 1}


@needs_shared
def test_held_out_rows_are_excluded_and_counted(world):
    held_coco = world["images"][1]["image_id"]
    held = {q for q, s in world["skipped"].items() if s["reason"] == "held_out"}
    held_statement = next(r["qid"] for r in world["statements"] if r["table_id"] == HELD_TABLE)
    assert {"musique-heldout", held_statement} <= held and any(q.startswith(held_coco) for q in held)
    read_ids = set(world["accepted"]) | set(world["rejected"])
    assert not held & read_ids
    assert world["summary"]["held_out_excluded"] == {"total": 3, "by_dataset": {"coco": 1, "musique": 1,
                                                                                 "tabfact": 1}}  # fmt: skip
    assert "held_out" not in world["summary"]["skipped_by_reason"]  # exclusions are not counted as bad rows
    assert "held-out rows excluded (never read for training): 3" in (world["out"] / "summary.md").read_text()


@needs_shared
def test_step_records_by_type_and_without_worked_examples(world):
    steps = world["steps"]
    by_type = world["summary"]["step_records"]["by_type"]
    assert by_type == {t: sum(r["step_type"] == t for r in steps) for t in ("answer", "final", "plan")}
    assert by_type["final"] == world["summary"]["accepted"]
    for r in steps:  # system + user only: no few-shot turns, and the settings say so
        assert [m["role"] for m in r["messages"]] == ["system", "user"]
        assert r["prompt_settings"]["few_shot"] is False
    musique = [r["step_type"] for r in steps if r["metadata"]["question_id"] == MUSIQUE]
    assert musique == ["plan", "answer", "plan", "answer", "plan", "final"]  # 2 hops, stop plan, final


class ReplayPolicy:
    """Writes, for each prompt the loop shows, the reply of the gold trajectory with the same question."""

    name = "replay"

    def __init__(self, trajs: list[dict], kbs: list) -> None:
        self.by_question = {t["question"]: t for t in trajs}
        self.answers = {s["sub_question"]: s for t in trajs for s in _retrievals(t)}
        self.kbs = kbs

    def _reply(self, conv: list[dict]) -> str:
        c = conv[-1]["content"]
        user = c if isinstance(c, str) else " ".join(p.get("text") or "" for p in c if p.get("type") == "text")
        if user.startswith("Evidence:"):
            s = self.answers[user.rsplit("\n\nQuestion: ", 1)[1]]
            return f"<think>{s['answer_think']}</think>\n<answer>{s['answer']}</answer>"
        t = self.by_question[user.split("\n", 1)[0].removeprefix("Original question: ")]
        if "Now give the final answer" in user:
            return f"<think>{t['final_think']}</think>\n<answer>{t['final_answer']}</answer>"
        s = t["steps"][user.count("\nSub-question ")]
        kb = kb_id(s["kb"], self.kbs, "display_name") if s["kb"] else "None"
        return (
            f"<think>{s['think']}</think>\n<sub-question>{s['sub_question'] or 'None'}</sub-question>\n<ret>{kb}</ret>"
        )

    def generate(self, conversations: list[list[dict]], params) -> list[Completion]:  # noqa: ANN001
        return [Completion(self._reply(c)) for c in conversations]


@needs_shared
def test_step_records_equal_what_the_live_loop_renders_for_the_same_steps(world):
    """The live loop, driven by a policy that writes the gold steps, sees the prompts the step records hold."""
    from agent.types import Question

    kbs = load_kbs(world["cfg"])
    menu = [(kb.display_name, kb.description) for kb in kbs.values()]
    gold = [world["accepted"][q] for q in (MUSIQUE, BRIDGE, world["statements"][0]["qid"], VIDEO_Q)]
    replay = ReplayPolicy(gold, list(kbs.values()))
    agent = StepAgent(replay, kbs, AgentConfig(max_steps=3, top_k=3, few_shot=False, max_retries=0))
    live = agent.run_batch([Question(t["id"], t["question"], tuple(t["images"]), tuple(t["gold"]), t["metadata"])
                            for t in gold])  # fmt: skip
    from agent.types import Trajectory

    for mine, theirs in zip(gold, live, strict=True):
        assert theirs.stop_reason == mine["stop_reason"]
        assert [(s.sub_question, s.kb, [h.doc.id for h in s.hits]) for s in theirs.steps] == [
            (s["sub_question"], s["kb"], [h["doc"]["id"] for h in s["hits"]]) for s in mine["steps"]]  # fmt: skip
        recorded = [r for r in world["steps"] if r["trajectory_id"] == mine["id"]]
        rendered = step_records(theirs, menu, kbs.values())
        assert [r["messages"] for r in rendered] == [r["messages"] for r in recorded]
        assert [r["gold"] for r in rendered] == [r["gold"] for r in recorded]
        assert step_records(Trajectory.from_dict(mine), menu, kbs.values()) == recorded


@needs_shared
def test_real_split_keeps_every_held_out_question_out(shared_path):
    """With the project's split file, no held-out HotpotQA / MuSiQue / TabFact / WTQ / COCO / video row is read."""
    from data_synthesis.config import InputSpec
    from data_synthesis.inputs import read_inputs

    split = ROOT / "data" / "splits" / "shared_heldout.json"
    if not split.exists():
        pytest.skip(f"{split} is absent (write it with `python scripts/make_splits.py`)")
    held = json.loads(split.read_text())["heldout"]
    specs = [InputSpec(path=str(shared_path(*p)), format=f, exclude_split=str(split))
             for p, f in ((("text", "questions.jsonl"), "shared_text"), (("table", "wtq", "questions.jsonl"), "wtq"),
                          (("image", "coco", "qa_derived.jsonl"), "coco"), (("video", "qa.jsonl"), "video"))]  # fmt: skip
    questions, skips = read_inputs(specs)
    ids = {q.id for q in questions}
    all_held = {q for entry in held.values() for q in entry["qids"]}
    assert not ids & all_held and ids
    assert sum(s.reason == "held_out" for s in skips) == sum(
        len(held[d]["qids"]) for d in ("hotpotqa", "musique", "wtq", "coco", "video")
    )
    assert not any(q.metadata["dataset"] == "video" for q in questions)  # all 15 video questions are held out


@needs_shared
def test_paper_step_file_becomes_gold_trajectories_with_its_own_evidence(world, shared_path, tmp_path):
    path = shared_path("r1router", "stepgrpo_valid.jsonl")
    cfg = SynthConfig(inputs=[{"path": str(path), "format": "r1router_steps", "limit": 4,
                               "kb_map": {"text retriever": "wiki", "table retriever": "wtq"}}],
                      kb_config=world["cfg"].kb_config, teacher={"backend": "annotation"}, m=1, temperature=0.0,
                      max_steps=3, output_dir=str(tmp_path / "out"), progress=False, export_format="none")  # fmt: skip
    summary = run_synthesis(cfg)
    trajs = read(tmp_path / "out" / "trajectories.jsonl")
    first = rows(path)[0]["steps"]
    assert summary["accepted"] == len(trajs) == 4 and summary["by_annotation"]["paper"]["accepted"] == 4
    t = trajs[0]
    assert [s["sub_question"] for s in _retrievals(t)] == [first[0]["answer"]["query"].strip(),
                                                           first[2]["answer"]["query"].strip()]  # fmt: skip
    assert "Frank Wisbar (born Franz Wysbar 9 December 1899" in _retrievals(t)[1]["hits"][1]["doc"]["text"]
    assert t["metadata"]["gold_support"] == [None, None]  # no corpus of ours holds the paper's evidence
    assert t["steps"][-1]["sub_question"] is None and t["final_answer"] == first[-1]["answer"][0]
