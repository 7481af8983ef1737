"""`kbrouter serve`: an OpenAI-compatible chat-completions endpoint over any kbrouter policy backend.

Concurrent requests with the same sampling settings are gathered for a few milliseconds and generated as one
batch, so many clients (synthesis workers, eval shards) share one model efficiently.
"""

import argparse
import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from agent.backends.base import Completion, Policy, SamplingParams, supports_grammar

logger = logging.getLogger(__name__)

MAX_BATCH = 32
GATHER_S = 0.01


@dataclass
class _Pending:
    messages: list
    params: SamplingParams
    future: asyncio.Future


def _to_kbrouter_messages(messages: list[dict]) -> list[dict]:
    """OpenAI content parts → kbrouter's (`image_url` data/file URLs → `{"type": "image", "image": ...}`)."""
    out = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError("each message needs 'role' and 'content'")
        content = m["content"]
        if isinstance(content, list):
            parts = []
            for p in content:
                if p.get("type") == "text":
                    parts.append({"type": "text", "text": p.get("text", "")})
                elif p.get("type") == "image_url":
                    url = p["image_url"]["url"] if isinstance(p.get("image_url"), dict) else p.get("image_url")
                    parts.append({"type": "image", "image": url})
                else:
                    raise ValueError(f"unsupported content part type {p.get('type')!r}")
            content = parts
        elif not isinstance(content, str):
            raise ValueError("message content must be a string or a list of parts")
        out.append({"role": m["role"], "content": content})
    return out


MAX_GRAMMAR_CHARS = 65_536


def request_grammar(body: dict) -> str | None:
    """The EBNF grammar of a request, in any of the fields vLLM (`structured_outputs.grammar`), SGLang (`ebnf`) and
    llama.cpp (`grammar`) servers accept; other structured-output kinds are refused by name."""
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise ValueError('structured_outputs must be an object, e.g. {"grammar": "root ::= ..."}')
        other = sorted(k for k, v in so.items() if k != "grammar" and v is not None)
        if other:
            raise ValueError(f"structured_outputs {other} are not supported here; send an EBNF `grammar`")
    found = [g for g in ((so or {}).get("grammar"), body.get("ebnf"), body.get("grammar")) if g is not None]
    if not found:
        return None
    grammar = found[0]
    if not isinstance(grammar, str) or not grammar.strip():
        raise ValueError("the grammar must be a non-empty EBNF string")
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise ValueError(f"the grammar has {len(grammar)} characters; at most {MAX_GRAMMAR_CHARS} are accepted")
    return grammar


def create_app(policy: Policy, model_name: str | None = None):  # noqa: ANN201 (FastAPI app)
    """The FastAPI app: POST /v1/chat/completions, GET /v1/models, GET /health."""
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="kbrouter policy server")
    name = model_name or policy.name
    queue: asyncio.Queue[_Pending] = asyncio.Queue()
    lock = asyncio.Lock()

    async def batcher() -> None:
        while True:
            first = await queue.get()
            batch = [first]
            deadline = time.perf_counter() + GATHER_S
            while len(batch) < MAX_BATCH:
                timeout = deadline - time.perf_counter()
                if timeout <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), timeout))
                except asyncio.TimeoutError:
                    break
            groups: dict[SamplingParams, list[_Pending]] = {}
            for p in batch:
                groups.setdefault(p.params, []).append(p)
            for params, items in groups.items():
                try:
                    async with lock:
                        outs = await asyncio.to_thread(policy.generate, [p.messages for p in items], params)
                    for p, out in zip(items, outs, strict=True):
                        p.future.set_result(out)
                except Exception as e:  # a failed batch fails its requests, not the server
                    logger.exception("generation failed")
                    for p in items:
                        if not p.future.done():
                            p.future.set_exception(e)

    @app.on_event("startup")
    async def _start() -> None:
        app.state.batcher = asyncio.create_task(batcher())

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": name}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "kbrouter"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
                raise ValueError("body must be a JSON object with a non-empty 'messages' list")
            if body.get("stream"):
                raise ValueError("stream=true is not supported; send stream=false")
            if int(body.get("n", 1)) != 1:
                raise ValueError("only n=1 is supported; send several requests instead")
            stop = body.get("stop") or ()
            grammar = request_grammar(body)
            if grammar and not supports_grammar(policy):
                raise ValueError(f"this server's policy ({name}) has no structured output; drop the grammar field")
            params = SamplingParams(
                max_new_tokens=int(
                    next((body[k] for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None), 256)
                ),
                temperature=float(body.get("temperature", 1.0)),
                top_p=float(body.get("top_p", 1.0)),
                top_k=int(body.get("top_k", 0) or 0),
                seed=body.get("seed"),
                stop=() if grammar else (stop,) if isinstance(stop, str) else tuple(stop),
                grammar=grammar,
            )
            messages = _to_kbrouter_messages(body["messages"])
        except (ValueError, TypeError, KeyError) as e:
            raise HTTPException(status_code=400, detail=str(e)) from e
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        await queue.put(_Pending(messages, params, fut))
        try:
            out: Completion = await fut
        except Exception as e:
            raise HTTPException(status_code=500, detail=f"generation failed: {e}") from e
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": out.text},
                        "finish_reason": "length" if out.finish_reason == "length" else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": out.prompt_tokens,
                    "completion_tokens": out.completion_tokens,
                    "total_tokens": out.prompt_tokens + out.completion_tokens,
                },
            }
        )

    return app


def main(argv: list[str] | None = None) -> int:
    """Serve a policy over HTTP (OpenAI chat-completions API)."""
    from agent.backends.factory import PolicyConfig, make_policy

    ap = argparse.ArgumentParser(prog="kbrouter serve", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="hub name, local folder, or `smollm2` (default)")
    ap.add_argument("--backend", default="transformers", choices=["transformers", "vl", "vllm"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--served-model-name", default=None, help="name clients send as `model`")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    import uvicorn

    policy = make_policy(PolicyConfig(backend=args.backend, model=args.model, dtype=args.dtype))
    app = create_app(policy, args.served_model_name or args.model)
    print(f"serving {args.model} at http://{args.host}:{args.port}/v1 (OpenAI chat completions)")  # noqa: T201 - the one line a person starting the server reads
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
