"""End to end on real parts: `kbrouter serve-agent` with the real SmolLM2-135M-Instruct policy over the real demo KB
(MiniLM + FAISS + BM25), through the official `openai` client, streaming. Marked slow (a model load and real
generation, ~1 min on 2 CPU cores): `pytest -m slow tests/agent/test_agent_server_e2e.py`."""

from __future__ import annotations

import pytest

from agent.agent_server import AgentSetup, create_agent_app
from agent.cli import DEMO_KB
from agent.loop import AgentConfig
from agent.types import Trajectory
from retrievers.service import serve_in_thread

pytestmark = pytest.mark.slow


def test_smollm2_over_the_demo_kb_streams_real_steps(smollm2_dir):
    openai = pytest.importorskip("openai")
    from agent.backends.factory import PolicyConfig, make_policy
    from agent.kbs import load_knowledge_bases

    kbs = load_knowledge_bases(str(DEMO_KB))
    policy = make_policy(PolicyConfig(model=smollm2_dir))
    setup = AgentSetup("kbrouter-demo", policy, kbs, AgentConfig(max_steps=1, min_steps=1))
    with serve_in_thread(create_agent_app([setup])) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
        chunks = list(
            client.chat.completions.create(
                model="kbrouter-demo",
                messages=[{"role": "user", "content": "Who directed the film Jaws?"}],
                stream=True,
            )
        )
    events = [c.model_extra["kbrouter"] for c in chunks if c.model_extra.get("kbrouter")]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "plan" and kinds[-1] == "final"
    traj = Trajectory.from_dict(events[-1]["trajectory"])
    assert traj.metadata["completion_tokens"] > 0
    searched = [e for e in events if e["event"] == "evidence"]
    assert searched, "constrained decoding with min_steps 1 must search once"
    # it searched in its only step, so it stopped on the step budget (or its final answer broke the format)
    assert traj.stop_reason in ("max_steps", "format_error") and traj.steps[0].sub_question is not None, traj
    hits = searched[0]["hits"]
    assert hits and all(h["kb"] in {"text", "table"} for h in hits)  # cards name the KB, not its display name
    assert [h["rank"] for h in hits] == list(range(len(hits)))  # the cards in rank order, best score first
    assert all(a["score"] >= b["score"] for a, b in zip(hits, hits[1:], strict=False))
    display = {kb.name: kb.display_name for kb in kbs.values()}[hits[0]["kb"]]
    assert (searched[0]["kb"], searched[0]["kb_name"]) == (display, hits[0]["kb"])  # the event names its KB both ways
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == traj.final_answer
