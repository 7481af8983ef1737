"""`kbrouter ask | run | demo` on bad input and failures, over a scripted policy and an in-memory KB (no model):
a backend error exits non-zero, an image for a text-only policy is an error, the demo replaces its output, Ctrl-C
says what was kept, a model that cannot be found offline fails at once naming the offline aliases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kbrouter.cli import main
from retrievers.jsonl import read_jsonl
from tests.fakes import FakeRetriever, ScriptedPolicy, last_user_text


def _script(conv: list[dict]) -> str:
    if "next step" in last_user_text(conv):
        return "<think>done</think><sub-question>None</sub-question><ret>None</ret>"
    return "<think>t</think><answer>Paris</answer>"


@pytest.fixture
def fake_parts(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The real `_setup` of agent.cli, with the policy and the KBs replaced by fakes; `state["fail"]` makes every
    generate call raise a BackendError; `state["policies"]` records the configs asked for."""
    import agent.backends.factory
    import agent.kbs
    from agent.kbs import KnowledgeBase

    state: dict = {"fail": False, "policies": [], "on_generate": None}

    def make_policy(cfg):  # noqa: ANN001, ANN202
        state["policies"].append(cfg)
        policy = ScriptedPolicy(_script, fail_on=lambda conv: state["fail"])
        generate = policy.generate

        def hooked(convs, params):  # noqa: ANN001, ANN202
            if state["on_generate"]:
                state["on_generate"]()
            return generate(convs, params)

        policy.generate = hooked
        return policy

    def load_knowledge_bases(kb_file, only=None, build=True):  # noqa: ANN001, ANN202
        return {"Text Retriever": KnowledgeBase("text", "Text Retriever", FakeRetriever("text", ["paris"]), k=1)}

    monkeypatch.setattr(agent.backends.factory, "make_policy", make_policy)
    monkeypatch.setattr(agent.kbs, "load_knowledge_bases", load_knowledge_bases)
    return state


def _questions(tmp_path: Path, n: int = 4, **extra: object) -> Path:
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "question": f"q{i}", **extra}) + "\n" for i in range(n)))
    return path


def test_ask_exits_nonzero_when_the_backend_failed(fake_parts: dict, capsys: pytest.CaptureFixture) -> None:
    assert main(["ask", "What is the capital of France?", "--max-steps", "1"]) == 0
    fake_parts["fail"] = True
    assert main(["ask", "What is the capital of France?", "--max-steps", "1"]) == 1
    assert "the backend failed (" in capsys.readouterr().err


def test_run_exits_nonzero_when_trajectories_ended_in_backend_errors(
    fake_parts: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    fake_parts["fail"] = True
    out = tmp_path / "out.jsonl"
    assert main(["run", "--kb", "k.yaml", "--questions", str(_questions(tmp_path)), "--out", str(out)]) == 1
    assert "4 trajectories ended in backend_error; rerun the same command to retry them" in capsys.readouterr().err
    fake_parts["fail"] = False
    assert main(["run", "--kb", "k.yaml", "--questions", str(_questions(tmp_path)), "--out", str(out)]) == 0


def test_an_image_for_a_text_only_policy_is_an_error(
    fake_parts: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    image = tmp_path / "cat.png"
    image.write_bytes(b"not read")
    assert main(["ask", "What animal is this?", "--image", str(image)]) == 2
    err = capsys.readouterr().err
    assert "reads text only and would drop it" in err and "--backend vl --model tiny-qwen2.5-vl" in err
    assert fake_parts["policies"] == []  # nothing loaded
    questions = _questions(tmp_path, images=[str(image)])
    argv = ["run", "--kb", "k.yaml", "--questions", str(questions), "--out", str(tmp_path / "o.jsonl")]
    assert main(argv) == 2
    assert "4 question(s) have an image" in capsys.readouterr().err
    # an explicit flag makes it a warning
    assert main(["ask", "What animal is this?", "--image", str(image), "--allow-text-only", "--max-steps", "1"]) == 0


def test_demo_replaces_its_output_instead_of_appending(fake_parts: dict, tmp_path: Path) -> None:
    out = tmp_path / "demo" / "trajectories.jsonl"
    argv = ["demo", "--questions", str(_questions(tmp_path, 3)), "--out", str(out), "--max-steps", "1"]
    assert main(argv) == 0
    assert main(argv) == 0
    assert [r["id"] for r in read_jsonl(out)] == ["0", "1", "2"]


@pytest.mark.parametrize(("flag", "value"), [("--batch-size", "-1"), ("--batch-size", "0"), ("--limit", "-1")])
def test_run_rejects_a_bad_batch_size_or_limit(
    fake_parts: dict, tmp_path: Path, capsys: pytest.CaptureFixture, flag: str, value: str
) -> None:
    out = tmp_path / "o.jsonl"
    with pytest.raises(SystemExit) as e:
        main(["run", "--kb", "k.yaml", "--questions", str(_questions(tmp_path)), "--out", str(out), flag, value])
    assert e.value.code == 2 and f"{flag} must be >= " in capsys.readouterr().err


def test_ctrl_c_on_run_says_what_was_kept_and_exits_130(
    fake_parts: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    calls = {"n": 0}

    def interrupt_on_the_third_call() -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt

    fake_parts["on_generate"] = interrupt_on_the_third_call
    out = tmp_path / "out.jsonl"
    argv = ["run", "--kb", "k.yaml", "--questions", str(_questions(tmp_path)), "--out", str(out)]
    assert main([*argv, "--batch-size", "1", "--max-steps", "1"]) == 130
    err = capsys.readouterr().err
    kept = len(list(read_jsonl(out)))
    assert f"interrupted: {kept} of 4 done, in {out}; rerun the same command to resume" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    fake_parts["on_generate"] = None
    assert main([*argv, "--max-steps", "1"]) == 0
    assert sorted(r["id"] for r in read_jsonl(out)) == ["0", "1", "2", "3"]


def test_a_model_neither_local_nor_cached_fails_fast_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import socket

    from agent.backends.models import check_model_available

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dialled: list = []  # offline, the hub is not even tried (transformers retried it for 148 s)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: dialled.append(a) or socket.socket())
    monkeypatch.setattr(socket.socket, "connect", lambda self, *a: dialled.append(a))
    with pytest.raises(FileNotFoundError) as e:
        check_model_available("Qwen/Qwen2.5-VL-7B-Instruct")
    assert dialled == []
    assert all(alias in str(e.value) for alias in ("smollm2", "smollm2-kbrouter", "tiny-qwen2.5-vl"))
    # cached: fine offline; a local folder: fine; a missing folder: named
    (tmp_path / "hub" / "models--Qwen--Qwen2.5-VL-7B-Instruct" / "snapshots" / "abc").mkdir(parents=True)
    check_model_available("Qwen/Qwen2.5-VL-7B-Instruct")
    check_model_available(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="model folder '/no/such/model' does not exist"):
        check_model_available("/no/such/model")


def test_the_vl_backend_fails_fast_offline_through_the_cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import agent.kbs
    from agent.kbs import KnowledgeBase

    monkeypatch.setattr(
        agent.kbs,
        "load_knowledge_bases",
        lambda *a, **k: {"T": KnowledgeBase("t", "T", FakeRetriever("t", ["x"]), k=1)},
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    image = tmp_path / "photo.jpg"
    image.write_bytes(b"x")
    argv = ["ask", "What animal is this?", "--image", str(image), "--backend", "vl"]
    assert main([*argv, "--model", "Qwen/Qwen2.5-VL-7B-Instruct"]) == 2
    err = capsys.readouterr().err
    assert "tiny-qwen2.5-vl" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"max_steps": "3"}, r"agent.`max_steps` must be an integer, got '3'"),
        ({"few_shot": "no"}, r"agent.`few_shot` must be true or false"),
        ({"plan_tokens": 0}, r"agent.plan_tokens must be >= 1"),
        ({"temperature": -1.0}, r"agent.temperature"),
        ({"top_p": 0.0}, r"0 < agent.top_p <= 1"),
    ],
)
def test_agent_settings_are_type_and_range_checked(overrides: dict, match: str) -> None:
    from agent.loop import AgentConfig

    with pytest.raises(ValueError, match=match):
        AgentConfig(**overrides)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"max_batch_size": 0}, r"policy.max_batch_size must be >= 1"),
        ({"max_batch_size": "8"}, r"policy.`max_batch_size` must be an integer"),
        ({"model": 7}, r"policy.`model` must be a string"),
        ({"min_pixels": 10, "max_pixels": 5}, r"0 < policy.min_pixels <= policy.max_pixels"),
    ],
)
def test_policy_settings_are_type_and_range_checked(overrides: dict, match: str) -> None:
    from agent.backends.factory import PolicyConfig

    with pytest.raises(ValueError, match=match):
        PolicyConfig(**overrides)
