"""The held-out scoreboard's parts: split filtering, agent variants (merging, errors, one load per policy), the
valid-step rate and per-step routing accuracy on hand-made trajectories, and the per-variant routing plot."""

from __future__ import annotations

import json
import os
import weakref
from pathlib import Path

import pytest

from agent.types import Step, Trajectory
from eval.config import load_eval_config
from eval.datasets import DatasetSpec, load_dataset
from eval.runner import run_eval
from eval.scoring import mean_scores, output_validity, score_prediction
from retrievers.types import Doc, Hit
from tests.conftest import SHARED
from tests.eval.conftest import QUESTIONS, eval_yaml
from tests.fakes import FakePolicy

ROOT = Path(__file__).resolve().parents[2]
SPLITS = ROOT / "data" / "splits" / "shared_heldout.json"


# -- split filtering --------------------------------------------------------------------------------------------
def _split_file(tmp_path: Path, heldout: dict) -> Path:
    path = tmp_path / "splits.json"
    path.write_text(json.dumps({"rule": "test", "heldout": heldout}))
    return path


@pytest.mark.parametrize("seed", [0, 1, 2, None])  # whatever the sampling, no training question gets through
def test_heldout_only_dataset_never_yields_a_training_question(tmp_path: Path, seed: int | None) -> None:
    rows = [{"id": f"q{i}", "question": f"question {i}?", "answers": ["a"]} for i in range(40)]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = {f"q{i}" for i in range(0, 40, 3)} | {"not-in-the-file"}  # the file may list ids the loader lacks
    split = _split_file(tmp_path, {"toy": {"qids": sorted(held)}, "other": {"qids": ["q1", "q2"]}})
    for limit in (None, 5):
        spec = DatasetSpec(
            name="toy",
            loader="jsonl",
            path=str(tmp_path / "q.jsonl"),
            split_file=str(split),
            sample_seed=seed,
            limit=limit,
        )
        ds = load_dataset(spec)
        ids = {q.id for q in ds.questions}
        assert ids <= held and len(ids) == (limit or 14)
        assert "14 of 40" in ds.split  # the report says how many of the file's questions are held out
    # `split_key` picks another entry of the same file
    other = load_dataset(
        DatasetSpec(
            name="toy", loader="jsonl", path=str(tmp_path / "q.jsonl"), split_file=str(split), split_key="other"
        )
    )
    assert {q.id for q in other.questions} == {"q1", "q2"}


def test_split_file_errors(tmp_path: Path) -> None:
    (tmp_path / "q.jsonl").write_text(json.dumps({"id": "a1", "question": "q?", "answers": ["x"]}) + "\n")
    split = _split_file(tmp_path, {"hotpotqa": {"qids": ["hotpotqa-dev-1"]}})

    def load(**kw: str) -> None:
        load_dataset(DatasetSpec(name="toy", loader="jsonl", path=str(tmp_path / "q.jsonl"), **kw))

    # the dataset has no entry: the message lists the entries there are
    with pytest.raises(ValueError, match=r"no held-out ids for 'toy'; it has \['hotpotqa'\].*split_key"):
        load(split_file=str(split))
    # an entry whose ids the loader never emits is a naming mismatch, not an empty dataset
    with pytest.raises(ValueError, match=r"none of the 1 question ids .*'a1'.*'hotpotqa-dev-1'"):
        load(split_file=str(split), split_key="hotpotqa")
    with pytest.raises(FileNotFoundError, match=r"make_splits.py"):
        load(split_file=str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"`split_key` needs `split_file:`"):
        DatasetSpec(name="toy", loader="jsonl", path="q.jsonl", split_key="x")


@pytest.mark.skipif(not (SHARED.is_dir() and SPLITS.is_file()), reason=f"{SHARED} or {SPLITS} is absent")
@pytest.mark.parametrize("loader", ["hotpotqa", "musique", "tabfact", "wtq", "coco", "video"])
def test_shared_loaders_ids_are_the_split_qids(loader: str) -> None:
    heldout = json.loads(SPLITS.read_text())["heldout"][loader]["qids"]
    every = {q.id for q in load_dataset(DatasetSpec(name=loader, loader=loader), SHARED).questions}
    kept = load_dataset(DatasetSpec(name=loader, loader=loader, split_file=str(SPLITS)), SHARED)
    ids = {q.id for q in kept.questions}
    assert ids == set(heldout) & every and ids  # every held-out question the loader has, and only those
    assert not ids & (every - set(heldout))  # no training question
    if loader == "hotpotqa":
        assert all(i.startswith("hotpotqa-dev-") for i in ids)  # HotpotQA's held-out split is its dev split


def test_scoreboard_recipe_reads_heldout_questions_only() -> None:
    cfg = load_eval_config(ROOT / "configs" / "eval" / "scoreboard_cpu.yaml")
    specs = cfg.dataset_specs()
    assert specs and all(Path(s.split_file).resolve() == SPLITS.resolve() for s in specs)
    assert {"agent_base_fewshot", "agent_base_constrained", "agent_sft", "agent_grpo"} <= set(cfg.methods)


# -- agent variants -----------------------------------------------------------------------------------------------
def _variants_yaml(tmp_path: Path, questions: Path, variants: dict, methods: list[str] | None = None) -> Path:
    return eval_yaml(
        tmp_path,
        questions,
        methods or ["no_retrieval", *variants],
        agent_variants=variants,
        policy={"backend": "transformers", "model": "base-model", "max_batch_size": 4},
    )


def test_variant_settings_merge_onto_the_defaults(tmp_path: Path, questions_file: Path) -> None:
    cfg = load_eval_config(
        _variants_yaml(
            tmp_path,
            questions_file,
            {
                "plain": {},
                "short": {"agent": {"max_steps": 1, "few_shot": False}},
                "small_batch": {"policy": {"max_batch_size": 2}},
            },
        )
    )
    # the policy: the config's, with only the overridden keys changed
    assert cfg.policy_settings("plain") == cfg.policy_settings("no_retrieval") == cfg.policy
    assert cfg.policy_settings("small_batch") == {**cfg.policy, "max_batch_size": 2}
    # the loop: the config's `agent` (max_steps 2, max_retries 0), with the variant's keys on top
    assert (cfg.agent_config("short").max_steps, cfg.agent_config("short").few_shot) == (1, False)
    assert cfg.agent_config("short").max_retries == 0 == cfg.agent_config("plain").max_retries
    assert cfg.agent_config("plain") == cfg.agent_config()
    # what differs between variants is in their fingerprints; identical settings differ only by the method name
    prints = {m: cfg.fingerprint(m) for m in ("plain", "short", "small_batch")}
    assert len(set(prints.values())) == 3
    again = load_eval_config(
        _variants_yaml(
            tmp_path,
            questions_file,
            {
                "plain": {},
                "short": {"agent": {"max_steps": 2, "few_shot": False}},
                "small_batch": {"policy": {"max_batch_size": 2}},
            },
        )
    )
    assert again.fingerprint("short") != prints["short"] and again.fingerprint("plain") == prints["plain"]


def test_a_local_checkpoint_retrained_in_place_changes_the_fingerprint(tmp_path: Path, questions_file: Path) -> None:
    adapter = tmp_path / "sft" / "final"
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"v1")
    cfg = load_eval_config(_variants_yaml(tmp_path, questions_file, {"sft": {"policy": {"model": str(adapter)}}}))
    before = cfg.fingerprint("sft")
    (adapter / "README.md").write_text("# model card, edited after the eval\n")
    assert cfg.fingerprint("sft") == before  # documentation changes no prediction
    weights = adapter / "adapter_model.safetensors"
    os.utime(weights, ns=(0, 0))  # the same bytes put back by a git checkout or a copy: a new mtime, same predictions
    assert cfg.fingerprint("sft") == before
    weights.write_bytes(b"v2")  # retrained in place: same size, other bytes
    assert cfg.fingerprint("sft") != before


def test_a_router_cards_agent_section_is_not_in_the_fingerprint(tmp_path: Path, questions_file: Path) -> None:
    """The card's `agent` settings are what demo/ask/run default to; eval runs its own, so they change no prediction.
    The KB names it trained on do (the route prior reads them)."""
    import json

    from agent.backends.models import ROUTER_CARD, write_router_card

    adapter = tmp_path / "router"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"v1")
    write_router_card(adapter, {"Text Retriever"})
    cfg = load_eval_config(_variants_yaml(tmp_path, questions_file, {"r": {"policy": {"model": str(adapter)}}}))
    before = cfg.fingerprint("r")
    card = adapter / ROUTER_CARD
    card.write_text(json.dumps({**json.loads(card.read_text()), "agent": {"top_k": 3}}, indent=1) + "\n")
    assert cfg.fingerprint("r") == before
    write_router_card(adapter, {"Text Retriever", "Clip Retriever"})
    assert cfg.fingerprint("r") != before


def test_a_large_weight_shard_counts_by_size_and_mtime(tmp_path: Path, questions_file: Path, monkeypatch) -> None:
    import eval.config

    monkeypatch.setattr(eval.config, "CONTENT_HASH_BYTES", 1)  # every file is "large": no file is read
    shard = tmp_path / "model" / "model.safetensors"
    shard.parent.mkdir()
    shard.write_bytes(b"weights")
    cfg = load_eval_config(_variants_yaml(tmp_path, questions_file, {"big": {"policy": {"model": str(shard.parent)}}}))
    before = cfg.fingerprint("big")
    os.utime(shard, ns=(0, 0))
    assert cfg.fingerprint("big") != before


@pytest.mark.parametrize(
    ("variants", "message"),
    [
        # a typo at the variant's top level
        (
            {"v": {"agents": {"max_steps": 1}}},
            r"agent_variants\.v: unknown key\(s\) \['agents'\]; valid: \['method', 'policy', 'agent'\]",
        ),
        # a key the loop does not have
        ({"v": {"agent": {"max_step": 1}}}, r"agent_variants\.v\.agent has unknown key\(s\) \['max_step'\]"),
        # a key the policy config does not have
        ({"v": {"policy": {"modle": "x"}}}, r"agent_variants\.v\.policy: unknown key\(s\) \['modle'\]"),
        # a valid key with an invalid value: AgentConfig's own message, prefixed with where it is
        ({"v": {"agent": {"top_k": 0}}}, r"agent_variants\.v: top_k must be >= 1"),
        # a built-in method's name
        ({"rag_all": {}}, r"agent_variants\.rag_all: 'rag_all' is a built-in method name \(rag_\* .*e\.g\. all_v2"),
        ({"rag_all_v2": {}}, r"'rag_all_v2' is a built-in method name .*e\.g\. all_v2_v2"),
        ({"router": {}}, r"'router' is a built-in method name; call the variant e\.g\. router_v2"),
        # not a mapping
        ({"v": "runs/x"}, r"agent_variants\.v: expected a mapping"),
        ({"v": {"agent": ["few_shot"]}}, r"agent_variants\.v\.agent: expected a mapping of overrides"),
    ],
)
def test_bad_variant_names_the_key_and_the_file(
    tmp_path: Path, questions_file: Path, variants: dict, message: str
) -> None:
    path = _variants_yaml(tmp_path, questions_file, variants, methods=["no_retrieval"])
    with pytest.raises(ValueError, match=message) as e:
        load_eval_config(path)
    assert str(path) in str(e.value)


def test_method_settings_override_a_builtin_methods_loop(tmp_path: Path, questions_file: Path) -> None:
    path = eval_yaml(tmp_path, questions_file, ["ircot", "rag_all"], method_settings={"ircot": {"max_steps": 1}})
    cfg = load_eval_config(path)
    assert cfg.agent_config("ircot").max_steps == 1 and cfg.agent_config("rag_all").max_steps == 2
    assert cfg.agent_config("ircot").max_retries == 0  # the rest comes from `agent`
    base = load_eval_config(eval_yaml(tmp_path, questions_file, ["ircot", "rag_all"], out="base"))
    assert cfg.fingerprint("ircot") != base.fingerprint("ircot") and cfg.fingerprint("rag_all") == base.fingerprint(
        "rag_all"
    )
    for settings, message in [
        ({"ircott": {"max_steps": 1}}, r"method_settings\.ircott: 'ircott' is not a built-in method"),
        ({"ircot": {"max_step": 1}}, r"method_settings\.ircot has unknown key\(s\) \['max_step'\]"),
        ({"ircot": {"max_steps": -1}}, r"method_settings\.ircot: max_steps must be >= 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_eval_config(eval_yaml(tmp_path, questions_file, ["ircot"], out="bad", method_settings=settings))
    with pytest.raises(ValueError, match=r"method_settings\.v: 'v' is an agent variant"):
        load_eval_config(
            eval_yaml(
                tmp_path,
                questions_file,
                ["v"],
                out="bad",
                agent_variants={"v": {}},
                method_settings={"v": {"max_steps": 1}},
            )
        )


def test_variant_override_from_the_command_line(tmp_path: Path, questions_file: Path) -> None:
    path = _variants_yaml(tmp_path, questions_file, {"v": {"agent": {"few_shot": False}}})
    cfg = load_eval_config(path, ["--agent_variants.v.agent.max_steps", "1"])
    assert cfg.agent_config("v").max_steps == 1 and cfg.agent_config("v").few_shot is False
    with pytest.raises(ValueError, match=r"agent_variants\.v\.agent has unknown key\(s\) \['maxsteps'\]"):
        load_eval_config(path, ["--agent_variants.v.agent.maxsteps", "1"])


class _Counted(FakePolicy):
    """A fake policy that knows its settings."""

    def __init__(self, settings: dict) -> None:
        super().__init__()
        self.settings = settings


def test_each_distinct_policy_loads_once_and_is_freed_before_the_next(
    tmp_path: Path, questions_file: Path, fake_kbs
) -> None:
    variants = {
        "v_small": {"policy": {"max_batch_size": 2}},  # its own policy
        "v_default": {"agent": {"max_steps": 1}},  # the config's policy (shared with no_retrieval)
        "v_small_short": {"policy": {"max_batch_size": 2}, "agent": {"max_steps": 1}},  # v_small's policy again
    }
    cfg = load_eval_config(
        _variants_yaml(
            tmp_path, questions_file, variants, methods=["v_small", "no_retrieval", "v_default", "v_small_short"]
        )
    )
    built: list[tuple[dict, str]] = []
    alive: list[weakref.ref] = []
    used: dict[str, str] = {}

    def factory(settings: dict, where: str) -> FakePolicy:
        assert all(ref() is None for ref in alive), "the previous policy is still in memory"
        built.append((settings, where))
        policy = _Counted(settings)
        alive.append(weakref.ref(policy))
        return policy

    def record(rec: dict) -> None:
        used[rec["method"]] = rec["trajectory"]["metadata"].get("model", "")

    run_eval(cfg, kbs=fake_kbs, policy_factory=factory, on_prediction=record)
    # two distinct policy settings -> two loads, the first one's methods all run before the second loads
    assert [s["max_batch_size"] for s, _ in built] == [2, 4]
    assert built[0][1] == "agent_variants.v_small.policy" and built[1][1] == "policy"
    assert set(used) == {"v_small", "no_retrieval", "v_default", "v_small_short"}
    assert all(ref() is None for ref in alive)  # and nothing holds the last one after the run
    # a rerun has nothing to compute, so it loads nothing
    built.clear()
    run_eval(cfg, kbs=fake_kbs, policy_factory=factory)
    assert built == []


def test_a_missing_adapter_fails_before_anything_loads(tmp_path: Path, questions_file: Path, fake_kbs) -> None:
    cfg = load_eval_config(
        _variants_yaml(
            tmp_path,
            questions_file,
            {"sft": {"policy": {"adapter": str(tmp_path / "no" / "adapter")}}},
            methods=["sft"],
        )
    )

    def factory(settings: dict, where: str) -> FakePolicy:
        raise AssertionError("nothing should load")

    with pytest.raises(FileNotFoundError, match=r"agent_variants\.sft\.policy\.adapter: .*no/adapter' does not exist"):
        run_eval(cfg, kbs=fake_kbs, policy_factory=factory)
    # a folder training has not written its adapter into yet
    (tmp_path / "no" / "adapter").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"has no adapter_config.json \(is its training still running\?\)"):
        run_eval(cfg, kbs=fake_kbs, policy_factory=factory)


# -- metrics on hand-made trajectories ------------------------------------------------------------------------------
def _hit(kb: str) -> Hit:
    return Hit(doc=Doc(id=f"{kb}-doc", text="x"), score=1.0, rank=0, kb=kb)


def _step(i: int, kb: str | None, errors: tuple[str, ...] = ()) -> Step:
    return Step(
        index=i,
        sub_question=None if kb is None else "q?",
        kb=kb,
        hits=() if kb is None else (_hit(kb),),
        format_errors=errors,
    )


def _traj(
    steps: list[Step],
    final_errors: list[str] | None = None,
    final_raw: tuple[str, ...] = ("<answer>x",),
    **meta: object,
) -> Trajectory:
    return Trajectory(
        id="q",
        question="Q?",
        steps=tuple(steps),
        final_answer="x",
        final_raw=final_raw,
        gold=("x",),
        metadata={"final_errors": final_errors or [], **meta},
    )


@pytest.mark.parametrize(
    ("traj", "step_protocol", "expected"),
    [
        # retrieve (plan + answer valid), stop plan (valid), final valid: 4 of 4
        (_traj([_step(0, "wiki"), _step(1, None)]), True, (4, 4)),
        # a retrieval whose answer lacked its tag: the plan still counts as valid (it retrieved), the answer does not
        (_traj([_step(0, "wiki", ("missing <answer>",)), _step(1, None)]), True, (3, 4)),
        # a malformed plan ends the loop (one invalid output), and the final answer was malformed too
        (_traj([_step(0, "wiki"), _step(1, None, ("unknown KB",))], ["missing <answer>"]), True, (2, 4)),
        # a backend error produced no final: nothing to count for it
        (_traj([_step(0, "wiki")], ["backend_error"], final_raw=()), True, (2, 2)),
        # a baseline (rag_all): its step is a search, not a generated plan; only its tagged answer counts
        (_traj([_step(0, "all")], ["missing <answer>"]), False, (0, 1)),
        # IRCoT answered inside its reasoning (no tagged answer generated): no output counts
        (_traj([_step(0, "all")], final_raw=()), False, (0, 0)),
        # the router: its <ret> reply counts; one that named no KB and no None is a format error
        (_traj([], route="format_error"), False, (1, 2)),
        (_traj([_step(0, "wiki")], route="wiki"), False, (2, 2)),
    ],
)
def test_output_validity(traj: Trajectory, step_protocol: bool, expected: tuple[int, int]) -> None:
    assert output_validity(traj, step_protocol) == expected


def _score(traj: Trajectory, gold_kb: str = "wiki") -> dict[str, float]:
    traj = Trajectory.from_dict({**traj.to_dict(), "metadata": {**traj.metadata, "gold_kb": gold_kb}})
    return score_prediction(
        {"trajectory": traj.to_dict(), "latency_s": 0.1, "error": ""},
        ["wiki", "tables"],
        routes=True,
        retrieves=True,
        step_protocol=True,
    )


def test_valid_step_rate_and_routing_per_step_are_pooled_over_steps() -> None:
    rows = [
        _score(_traj([_step(0, "wiki"), _step(1, "wiki")])),  # 5 of 5 valid; right at steps 1 and 2
        _score(_traj([_step(0, "tables"), _step(1, None)])),  # 4 of 4 valid; wrong at step 1, stopped at 2
        _score(_traj([_step(0, None, ("missing <ret>",))], ["missing <answer>"])),  # 0 of 2 valid; never routed
        _score(_traj([_step(0, "wiki"), _step(1, "tables", ("x",))]), gold_kb="other"),  # gold KB not configured
    ]
    mean = mean_scores(rows)
    # pooled: (5 + 4 + 0 + 4) valid of (5 + 4 + 2 + 5) outputs, not the mean of the per-question rates
    assert mean["format/valid_step_rate"] == pytest.approx(13 / 16)
    # step 1: 2 retrievals with a configured gold KB, 1 right; step 2: 1 retrieval, right
    assert mean["routing/accuracy@step1"] == pytest.approx(1 / 2)
    assert mean["routing/accuracy@step2"] == pytest.approx(1.0)
    assert mean["routing/step_accuracy"] == pytest.approx(2 / 3)
    assert "routing/accuracy@step3" not in mean
    # per question, the old figure: 1, 0 and 0 (never looked up) over the three questions with a configured gold KB
    assert mean["routing/accuracy"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("reply", "route", "steps"),
    [
        ("<ret>Table KB</ret>", "tables", 1),  # a KB: searched (by its name, not its display name)
        ("<ret>None</ret>", "none", 0),  # no lookup needed
        ("The answer is Paris.", "format_error", 0),  # answered instead of routing: no KB, no None
    ],
)
def test_router_records_its_decision(fake_kbs, reply: str, route: str, steps: int) -> None:
    from agent.loop import AgentConfig
    from agent.types import Question
    from eval.methods import MethodContext, router
    from eval.report import kb_choices

    class Routes(FakePolicy):
        def _reply(self, conv: list[dict]) -> str:
            return reply if "Choose where to look up" in conv[0]["content"] else super()._reply(conv)

    ctx = MethodContext(Routes(), fake_kbs, AgentConfig(max_steps=2, max_retries=0))
    (t,) = router([Question(id="q", question="What is the capital of France?", answers=("Paris",))], ctx)
    assert t.metadata["route"] == route and len(t.steps) == steps
    # the routing plot's step 1 shows the decision, format errors apart from "none"
    assert kb_choices([t], 1)[0] == {route: 1}


# -- the report -------------------------------------------------------------------------------------------------
class _SometimesMalformed(FakePolicy):
    """Like the fake policy, but writes an unknown KB in the first plan of the medal question."""

    def _reply(self, conv: list[dict]) -> str:
        text = super()._reply(conv)
        if "medal" in json.dumps(conv) and "<ret>Table KB</ret>" in text:
            return text.replace("Table KB", "Medal KB")
        return text


def test_report_has_the_scoreboard_and_routing_per_step_for_each_variant(
    tmp_path: Path, questions_file: Path, fake_kbs
) -> None:
    from PIL import Image

    def run(variants: dict, out: str) -> tuple[dict, Path]:
        path = eval_yaml(
            tmp_path, questions_file, ["no_retrieval", "router", *variants], out=out, agent_variants=variants
        )
        cfg = load_eval_config(path)
        return run_eval(cfg, kbs=fake_kbs, policy_factory=lambda s, w: _SometimesMalformed()), Path(cfg.output_dir)

    one, out_one = run({"v1": {}}, "one")
    three, out = run({"v1": {}, "v2": {"agent": {"max_steps": 1}}, "v3": {"agent": {"few_shot": False}}}, "three")
    assert three["routing_methods"] == ["router", "v1", "v2", "v3"]
    for v in ("v1", "v2", "v3"):
        steps = three["routing_by_step"]["custom"][v]
        # step 1: three text questions routed to wiki, the medal question's plan malformed (its own category)
        assert steps[0] == {"wiki": 3, "format_error": 1}
        assert len(steps) == three["config"]["agent_variants"][v].get("agent", {}).get("max_steps", 2)
    assert three["routing_by_step"]["custom"]["v1"][1] == {"none": 3, "ended": 1}  # the malformed one had ended
    # one row of panels per routing method: the figure grows with the variants
    h_one = Image.open(out_one / "routing_by_step.png").size[1]
    h_three = Image.open(out / "routing_by_step.png").size[1]
    assert h_three > 1.8 * h_one
    report = (out / "report.md").read_text()
    assert "## Scoreboard" in report and "### macro average over groups" in report and "### custom (toy)" in report
    assert "Valid steps" in report and "### Routing accuracy at each step" in report
    per = three["per_dataset"]["toy"]
    # v1: 4 plans at step 1 (1 malformed), 3 answers, 3 stop plans at step 2, 4 finals = 13 of 14 outputs valid
    assert per["v1"]["format/valid_step_rate"] == pytest.approx(13 / 14)
    assert per["v1"]["routing/accuracy@step1"] == 1.0  # every retrieval that happened went to the gold KB
    assert "routing/step_accuracy" not in per["no_retrieval"] and "format/valid_step_rate" in per["no_retrieval"]
    assert three["macro_over_groups"]["v1"]["format/valid_step_rate"] == pytest.approx(13 / 14)
    assert three["datasets"]["toy"]["qids"] == [q["id"] for q in QUESTIONS]


def test_a_reworded_question_is_recomputed(tmp_path: Path, questions_file: Path, fake_kbs) -> None:
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, ["no_retrieval"]))
    run_eval(cfg, policy=FakePolicy(), kbs=fake_kbs)
    rows = [{**q, "question": q["question"].replace("capital", "Capital")} for q in QUESTIONS]
    questions_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    computed: list[dict] = []
    run_eval(
        load_eval_config(eval_yaml(tmp_path, questions_file, ["no_retrieval"])),
        policy=FakePolicy(),
        kbs=fake_kbs,
        on_prediction=computed.append,
    )
    assert sorted(r["qid"] for r in computed) == ["q1", "q2", "q4"]  # q3 (no "capital") kept its prediction


def test_tabfact_is_asked_as_synthesis_asks_it_for_training(tmp_path: Path) -> None:
    # the SFT data is written by data_synthesis: eval must pose the same claim in the same words
    from data_synthesis.config import InputSpec
    from data_synthesis.inputs import read_inputs

    row = {"qid": "tabfact-val-t-0", "table_id": "t.csv", "statement": " the team score 3 goal ", "label": 0}
    path = tmp_path / "statements.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (q_eval,) = load_dataset(DatasetSpec(name="tabfact", loader="tabfact", path=str(path))).questions
    (q_synth,), _ = read_inputs([InputSpec(path=str(path), format="tabfact")])
    assert q_eval.question == q_synth.question == "Is it true that the team score 3 goal?"
    assert q_eval.answers == q_synth.answers == ("no",) and q_eval.id == q_synth.id


def test_report_splits_f1_recall_by_answer_type_and_constants_earn_only_their_word(
    tmp_path: Path, questions_file: Path, fake_kbs
) -> None:
    cfg = load_eval_config(eval_yaml(tmp_path, questions_file, ["always_no", "always_yes", "agent"]))
    results = run_eval(cfg, kbs=fake_kbs, policy_factory=lambda s, w: FakePolicy())
    typed = results["by_answer_type"]
    assert typed["yesno"]["always_yes"] == {"f1_recall": 1.0, "n": 1.0}  # q4, "Is Rome the capital of Italy?"
    assert typed["yesno"]["always_no"]["f1_recall"] == 0.0
    assert typed["open"]["always_yes"] == {"f1_recall": 0.0, "n": 3.0}  # a constant answers no open question
    assert typed["open"]["agent"]["f1_recall"] > 0.0
    assert "retrieval/recall@k" not in results["per_dataset"]["toy"]["always_no"]  # it never retrieves
    report = (Path(cfg.output_dir) / "report.md").read_text()
    assert "### F1-recall by answer type" in report and "| always_yes | **100.0 (1)** | 0.0 (3) |" in report


def test_route_prior_settings_enter_the_fingerprint_only_where_they_change_predictions() -> None:
    from agent.loop import AgentConfig
    from eval.config import agent_fingerprint_fields

    off = agent_fingerprint_fields(AgentConfig(route_prior=0))
    assert not {"route_prior", "route_prior_encoder", "route_prior_size"} & set(off)  # off: as before the prior
    sized = agent_fingerprint_fields(AgentConfig(route_prior=10))
    assert sized["route_prior"] == 10 and sized["route_prior_size"] > 0
    raw = agent_fingerprint_fields(AgentConfig(route_prior=10, route_prior_size=0))
    assert "route_prior_size" not in raw and raw["route_prior"] == 10  # no size term: predictions cached before it


@pytest.mark.parametrize("name", ["rag_all", "rag_all_focus", "rag_wiki", "router", "no_retrieval", "ircot"])
def test_the_suggested_variant_name_is_free(name: str) -> None:
    from eval.config import _free_name
    from eval.methods import reserved_method_name

    assert reserved_method_name(name) and not reserved_method_name(_free_name(name))
