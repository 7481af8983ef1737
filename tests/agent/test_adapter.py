"""LoRA adapters on the transformers backend: the shipped router alias, and the errors for a wrong or missing one."""

import json

import pytest

from agent.backends.models import ROUTER_ADAPTER, adapter_base_name, resolve_policy_model


@pytest.fixture(scope="module")
def tiny_adapter(tmp_path_factory, smollm2_dir):
    """A rank-2 LoRA adapter saved from SmolLM2 by peft, with non-zero weights (so merging changes outputs)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    out = tmp_path_factory.mktemp("adapter")
    peft_model.save_pretrained(out)
    return out


def test_router_alias_is_smollm2_plus_the_shipped_adapter():
    assert resolve_policy_model("smollm2-kbrouter", None) == ("smollm2", str(ROUTER_ADAPTER))
    assert resolve_policy_model("smollm2", None) == ("smollm2", None)
    with pytest.raises(ValueError, match="already brings its adapter"):
        resolve_policy_model("smollm2-kbrouter", "/some/adapter")


def test_shipped_adapter_is_small_safetensors_on_smollm2():
    weights = ROUTER_ADAPTER / "adapter_model.safetensors"
    assert weights.is_file(), "the router adapter ships in models/smollm2-kbrouter"
    assert weights.stat().st_size <= 25 * 2**20
    assert adapter_base_name(ROUTER_ADAPTER).endswith("SmolLM2-135M-Instruct")
    assert (ROUTER_ADAPTER / "README.md").is_file(), "the adapter has its model card"


def _cli_args(*flags: str):
    import argparse

    from agent.cli import add_common_args

    ap = argparse.ArgumentParser()
    add_common_args(ap, kb_default="configs/kb/demo.yaml")
    args, args.overrides = ap.parse_known_args(list(flags))
    return args


def test_the_cli_runs_an_adapter_with_the_settings_its_card_records(tmp_path):
    """demo/ask/run/serve-agent default to the agent settings in the adapter's kbrouter_router.json (the shipped
    router's: those of its scoreboard row); a flag or `--agent.KEY` still wins, and a policy without them keeps
    AgentConfig's."""
    from agent.backends.models import ROUTER_CARD, adapter_agent_settings
    from agent.cli import resolve_configs
    from agent.loop import AgentConfig

    shipped = adapter_agent_settings(ROUTER_ADAPTER)
    assert shipped, "the shipped router's card records the settings its figures were measured with"
    _, agent, _ = resolve_configs(_cli_args())  # the default model is the shipped router
    assert {k: getattr(agent, k) for k in shipped} == shipped
    assert any(getattr(AgentConfig(), k) != v for k, v in shipped.items())  # so the card, not a default, set them
    _, agent, _ = resolve_configs(_cli_args("--top-k", "7", "--agent.evidence_chars", "900"))
    assert (agent.top_k, agent.evidence_chars) == (7, 900)
    _, agent, _ = resolve_configs(_cli_args("--model", "smollm2"))  # the base model: no card
    assert (agent.top_k, agent.evidence_chars) == (AgentConfig().top_k, AgentConfig().evidence_chars)

    own = tmp_path / "adapter"
    own.mkdir()
    (own / ROUTER_CARD).write_text(json.dumps({"kb_names": ["Text Retriever"], "agent": {"top_k": 2}}))
    _, agent, _ = resolve_configs(_cli_args("--model", "smollm2", "--adapter", str(own)))
    assert agent.top_k == 2
    (own / ROUTER_CARD).write_text(json.dumps({"kb_names": [], "agent": {"top_kk": 2}}))
    with pytest.raises(ValueError, match=rf"unknown key 'top_kk' in {own / ROUTER_CARD}: agent; did you mean"):
        resolve_configs(_cli_args("--model", "smollm2", "--adapter", str(own)))
    (own / ROUTER_CARD).write_text(json.dumps({"kb_names": [], "agent": [2]}))
    with pytest.raises(ValueError, match="`agent` must map agent settings to values"):
        resolve_configs(_cli_args("--model", "smollm2", "--adapter", str(own)))


def test_the_shipped_settings_are_those_of_the_scoreboard_row():
    """The README's default-agent figures are the scoreboard's `agent_grpo_route` row: the settings the shipped
    card gives demo/ask/run must be that row's, or the figures describe another agent."""
    from agent.backends.models import adapter_agent_settings
    from eval.config import load_eval_config

    row = load_eval_config(ROUTER_ADAPTER.parents[1] / "configs" / "eval" / "scoreboard_cpu.yaml").agent_config(
        "agent_grpo_route"
    )
    shipped = adapter_agent_settings(ROUTER_ADAPTER)
    assert {k: getattr(row, k) for k in shipped} == shipped
    assert (row.few_shot, row.constrained, row.min_steps) == (False, "on", 1)  # demo/ask/run: off, auto (on), 1


def test_adapter_loads_merged_and_changes_the_model(tiny_adapter, smollm2_dir):
    from agent.backends.base import SamplingParams
    from agent.backends.hf import TransformersPolicy

    conv = [[{"role": "user", "content": "Name a large city."}]]
    params = SamplingParams(max_new_tokens=6)
    base = TransformersPolicy(smollm2_dir).generate(conv, params)[0].text
    tuned = TransformersPolicy(smollm2_dir, adapter=str(tiny_adapter))
    assert not any("lora" in n for n, _ in tuned.model.named_parameters())  # merged: base-model speed
    assert tuned.generate(conv, params)[0].text != base


def test_plan_adapter_serves_plan_steps_only(tiny_adapter, smollm2_dir):
    """With `plan_adapter`, a call marked `step="plan"` runs on the plan adapter's weights, every other on `adapter`'s
    (here none: the base model); the prefix cache of one never feeds the other."""
    from agent.backends.base import SamplingParams
    from agent.backends.hf import TransformersPolicy

    conv = [[{"role": "system", "content": "You are brief. " * 20}, {"role": "user", "content": "Name a large city."}]]
    base = TransformersPolicy(smollm2_dir, prefix_cache_mb=0).generate(conv, SamplingParams(max_new_tokens=6))[0]
    tuned = TransformersPolicy(smollm2_dir, adapter=str(tiny_adapter), prefix_cache_mb=0)
    tuned_text = tuned.generate(conv, SamplingParams(max_new_tokens=6))[0].text
    split = TransformersPolicy(smollm2_dir, plan_adapter=str(tiny_adapter), prefix_cache_mb=64)
    assert "plan:" in split.name
    for _ in range(2):  # the second round reads each model's own cached prefix
        for step, want in (("plan", tuned_text), ("answer", base.text), (None, base.text), ("plan", tuned_text)):
            assert split.generate(conv, SamplingParams(max_new_tokens=6, step=step))[0].text == want, step
    assert split.prefix_cache.hits and split.plan_prefix_cache.hits


def test_missing_plan_adapter_names_the_folder(tmp_path):
    from agent.backends.hf import TransformersPolicy

    with pytest.raises(FileNotFoundError, match=r"nowhere.*has no adapter_config.json"):
        TransformersPolicy("smollm2", plan_adapter=str(tmp_path / "nowhere"))


def test_adapter_trained_on_another_base_is_one_clear_error(tiny_adapter, tmp_path, smollm2_dir):
    from agent.backends.hf import TransformersPolicy

    other = tmp_path / "other"
    other.mkdir()
    for f in tiny_adapter.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((other / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "Qwen/Qwen2.5-VL-7B-Instruct"
    (other / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"adapter_config.json' was trained on 'Qwen2.5-VL-7B-Instruct'"):
        TransformersPolicy(smollm2_dir, adapter=str(other))


def test_missing_adapter_names_the_folder(tmp_path):
    from agent.backends.hf import TransformersPolicy

    with pytest.raises(FileNotFoundError, match=r"nowhere.*has no adapter_config.json"):
        TransformersPolicy("smollm2", adapter=str(tmp_path / "nowhere"))


def test_adapter_on_a_backend_that_cannot_load_it_fails_in_the_config():
    from agent.backends.factory import PolicyConfig

    with pytest.raises(ValueError, match="policy.adapter is read by the transformers backend"):
        PolicyConfig(backend="vllm", model="m", adapter="/a")
    with pytest.raises(ValueError, match="policy.plan_adapter is read by the transformers backend"):
        PolicyConfig(backend="openai", model="m", base_url="http://127.0.0.1:1/v1", plan_adapter="/a")
    with pytest.raises(ValueError, match="runs on the transformers backend"):
        PolicyConfig(backend="vllm", model="smollm2-kbrouter")
    with pytest.raises(ValueError, match="policy.send_step is read by the openai backend"):
        PolicyConfig(backend="transformers", send_step=True)


def test_the_loop_marks_each_call_with_its_step():
    """What `plan_adapter` dispatches on: plan calls carry step "plan", answer and final calls their own names."""
    from agent.kbs import KnowledgeBase
    from agent.loop import AgentConfig, StepAgent
    from agent.types import Question
    from tests.fakes import FakeRetriever, ScriptedPolicy

    seen = []

    class Recording(ScriptedPolicy):
        def generate(self, conversations, params):
            seen.extend((params.step, "next step" in str(c[-1]["content"])) for c in conversations)
            return super().generate(conversations, params)

    plans = iter(["<think>t</think>\n<sub-question>a?</sub-question>\n<ret>Text Retriever</ret>",
                  "<think>t</think>\n<sub-question>None</sub-question>\n<ret>None</ret>"])  # fmt: skip

    def script(conv):
        return next(plans) if "next step" in str(conv[-1]["content"]) else "<think>t</think>\n<answer>x</answer>"

    kb = KnowledgeBase(name="text", display_name="Text Retriever", retriever=FakeRetriever("text", ["a b"]))
    [traj] = StepAgent(Recording(script), {"Text Retriever": kb}, AgentConfig(max_steps=3)).run_batch(
        [Question(id="a", question="q")])  # fmt: skip
    assert traj.stop_reason == "answered"
    assert seen == [("plan", True), ("answer", False), ("plan", True), ("final", False)]


def test_steps_reach_a_served_policy_through_the_openai_backend():
    """policy.send_step: the agent on the openai backend marks each request, and `kbrouter serve` hands the step
    to its policy (where a plan adapter dispatches on it); without send_step the request carries none."""
    from fastapi.testclient import TestClient

    from agent.backends.base import Completion
    from agent.backends.openai_compat import OpenAICompatiblePolicy
    from agent.kbs import KnowledgeBase
    from agent.loop import AgentConfig, StepAgent
    from agent.server import create_app
    from agent.types import Question
    from tests.fakes import FakeRetriever

    seen, plans = [], []

    class Served:
        """Plans one search, then stops; records the step each request was marked with."""

        name, supports_grammar = "served", True

        def generate(self, conversations, params):
            seen.append(params.step)
            if "next step" not in str(conversations[0][-1]["content"]):
                return [Completion(text="<think>t</think>\n<answer>x</answer>")]
            plans.append(1)
            sub, kb = ("a?", "Text Retriever") if len(plans) == 1 else ("None", "None")
            return [Completion(text=f"<think>t</think>\n<sub-question>{sub}</sub-question>\n<ret>{kb}</ret>")]

    kb = KnowledgeBase(name="text", display_name="Text Retriever", retriever=FakeRetriever("text", ["a b"]))
    with TestClient(create_app(Served())) as client:
        for send_step, expected in ((True, ["plan", "answer", "plan", "final"]), (False, [None] * 4)):
            seen.clear(), plans.clear()
            policy = OpenAICompatiblePolicy("http://testserver/v1", "served", send_step=send_step)
            policy._client = client  # the real app in-process: same request, no socket
            agent = StepAgent(policy, {"Text Retriever": kb}, AgentConfig(max_steps=3, constrained="off"))
            [traj] = agent.run_batch([Question(id="a", question="q")])
            assert traj.stop_reason == "answered" and seen == expected
        bad = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                         "kbrouter_step": "route"})  # fmt: skip
        assert bad.status_code == 400 and "kbrouter_step" in bad.json()["detail"]
