"""Chat-completion payloads of the agent (`kbrouter serve-agent`): the whole response of a finished trajectory, and
the server-sent chunks of a running one (schema: `agent.agent_server`'s docstring).

A step's `kb` is the KB's display name and `kb_name` its name, both through `agent.chat.kb_label` (that is,
`agent.step_records.kb_id`); a KB the server does not know is shown as the trajectory names it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

from agent.chat import evidence_line, hit_card, kb_label, plan_line, public_trajectory, reasoning_of
from agent.kbs import KnowledgeBase
from agent.types import Trajectory
from retrievers.security import MediaRoots, error_payload

logger = logging.getLogger(__name__)


def step_cards(traj: Trajectory, media: MediaRoots, kbs: dict[str, KnowledgeBase]) -> list[dict]:
    """Each step of a trajectory with its hits as cards (the `steps` of the extension field)."""
    known = list(kbs.values())
    return [
        {
            "index": s.index,
            "think": s.think,
            "sub_question": s.sub_question,
            "kb": kb_label(s.kb, known),
            "kb_name": s.kb,
            "answer": s.answer,
            "format_errors": list(s.format_errors),
            "hits": [hit_card(h, media) for h in s.hits],
        }
        for s in traj.steps
    ]


def usage(traj: Trajectory) -> dict:
    """OpenAI `usage` from a trajectory's token counts."""
    p, c = int(traj.metadata.get("prompt_tokens", 0)), int(traj.metadata.get("completion_tokens", 0))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def completion(
    cid: str, created: int, model: str, traj: Trajectory, media: MediaRoots, kbs: dict[str, KnowledgeBase]
) -> dict:
    """The `chat.completion` of a finished trajectory: the answer, the reasoning text and the extension field."""
    reasoning = reasoning_of(traj, kbs.values())
    message = {"role": "assistant", "content": traj.final_answer, "reasoning_content": reasoning}
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": usage(traj),
        "kbrouter": {"trajectory": public_trajectory(traj, media), "steps": step_cards(traj, media, kbs)},
    }


async def stream_chunks(  # noqa: ANN201
    run: asyncio.Future,
    cancelled,  # noqa: ANN001 (threading.Event)
    events: asyncio.Queue,
    model: str,
    cid: str,
    created: int,
    media: MediaRoots,
    kbs: dict[str, KnowledgeBase],
    stats: dict,
) -> AsyncIterator[str]:
    """Server-sent events for one running agent: role, reasoning deltas per event, the answer, `[DONE]`."""

    def chunk(delta: dict, ext: dict | None = None, finish: str | None = None) -> str:
        payload = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if ext is not None:
            payload["kbrouter"] = ext
        return f"data: {json.dumps(payload)}\n\n"

    finished = False
    try:
        yield chunk({"role": "assistant", "content": ""})
        while True:
            get = asyncio.ensure_future(events.get())
            done, _ = await asyncio.wait({get, run}, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                get.cancel()
                if events.empty():
                    break
                continue
            event, p = get.result()
            if event == "plan":
                kb = p.get("kb")
                ext = {"event": "plan", **p, "kb_name": kb_label(kb, kbs.values(), "name")}
                text = plan_line(p["step"], p.get("think"), p.get("sub_question"), kb, p.get("errors", []))
                yield chunk({"reasoning_content": text + "\n"}, ext)
            elif event == "evidence":
                cards = [hit_card(h, media) for h in p["hits"]]
                # from the plan, not from the first card: a search that found nothing still names its KB
                kb_name = kb_label(p["kb"], kbs.values(), "name")
                ext = {"event": "evidence", "step": p["step"], "kb": p["kb"], "kb_name": kb_name, "hits": cards}
                yield chunk({"reasoning_content": evidence_line(p["kb"], cards) + "\n"}, ext)
            elif event == "answer":
                ext = {"event": "answer", **p}
                yield chunk({"reasoning_content": f"Answer {p['step'] + 1}: {p['answer']}\n\n"}, ext)
        try:
            traj = run.result()
        except Exception as e:
            stats["errors"] += 1
            logger.exception("agent run failed")
            yield f"data: {json.dumps(error_payload(f'the agent failed: {e}', 'server_error'))}\n\n"
            yield "data: [DONE]\n\n"
            finished = True
            return
        if traj.stop_reason == "backend_error":
            stats["errors"] += 1
            message = f"the policy or a KB failed: {traj.metadata.get('error', '')}"
            yield f"data: {json.dumps(error_payload(message, 'server_error'))}\n\n"
        else:
            yield chunk({"content": traj.final_answer})
            final = {
                "event": "final",
                "answer": traj.final_answer,
                "stop_reason": traj.stop_reason,
                "trajectory": public_trajectory(traj, media),
                "steps": step_cards(traj, media, kbs),
            }
            yield chunk({}, final, finish="stop")
        yield "data: [DONE]\n\n"
        finished = True
    finally:
        cancelled.set()
        if not finished:
            stats["cancelled"] += 1
