"""`kbrouter serve-agent`: the step-wise agent as an OpenAI-compatible model, with a web page at `/`.

    kbrouter serve-agent --kb configs/kb/demo.yaml                        # http://127.0.0.1:8100/
    kbrouter serve-agent --kb configs/kb/demo_multimodal.yaml --backend vl --model Qwen/Qwen2.5-VL-3B-Instruct \
        --host 0.0.0.0 --api-key "$(openssl rand -hex 16)"

`model` names an agent setup (a policy, a KB set and loop settings); GET /v1/models lists them. POST
/v1/chat/completions answers the last user turn step by step (earlier turns are context; an image part, sent as a
data URL, is the question image). The `kbrouter` extension field carries the structure:

- `stream: true`: server-sent `chat.completion.chunk`s. Each step's thought, sub-question, KB and a one-line evidence
  summary arrive as `delta.reasoning_content`; every chunk that reports an event also has a top-level `kbrouter`
  object: `{"event": "plan", "step", "think", "sub_question", "kb", "kb_name", "errors"}`,
  `{"event": "evidence", "step", "kb", "kb_name", "hits": [card, ...]}`, `{"event": "answer", "step", "answer"}`
  and, with the last chunk, `{"event": "final", "answer", "stop_reason", "trajectory"}`. The final answer is
  `delta.content`. A card is `{"id", "kb", "score", "rank", "title", "modality", "snippet", "table": {"header",
  "rows"} | null, "media": {"url", "kind": "image" | "video", "start", "end"} | null}` (`agent.chat.hit_card`).
- `stream: false`: `message.content` is the answer, `message.reasoning_content` the steps as text, and the top-level
  `kbrouter` holds `{"trajectory": ..., "steps": [{"index", ..., "hits": [card, ...]}]}`. The trajectory reads back
  with `agent.types.Trajectory.from_dict` (media paths are replaced by the server's links).
- Request extras: `kbrouter: {"max_steps": N, "kbs": [KB names]}` narrow one request's steps and KBs (a display name
  also names its KB, as `agent.step_records.kb_id` reads either).

Concurrent requests share the policy through the micro-batcher of `kbrouter serve` (`retrievers.batching`): every
running agent's generate calls with equal settings become one batched call, and searches are batched per KB.
A client that disconnects (or cancels its stream) stops its agent at the next step boundary and frees its slot.
"""

# No `from __future__ import annotations`: FastAPI must resolve the `Request` annotation of the handlers.

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from agent.backends.base import BackendError, Completion, Policy, SamplingParams, per_row_params, supports_grammar
from agent.backends.factory import PolicyConfig
from agent.chat import Turn, latest_images, question_text
from agent.completions import completion, stream_chunks
from agent.kbs import KnowledgeBase
from agent.loop import AgentConfig, StepAgent
from agent.server import ChatMessage, ImageURL, TextPart, validation_message
from agent.step_records import kb_id
from agent.types import Question, Trajectory
from retrievers.batching import MicroBatcher
from retrievers.security import (
    Guard,
    ImageLimits,
    ImageUploads,
    MediaRoots,
    RequestLimits,
    error_payload,
)
from retrievers.types import Hit, Query

logger = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parent / "web"
DEFAULT_PORT = 8100


@dataclass
class AgentSetup:
    """One model the server offers: a policy over a KB set (keyed by display name) with loop settings."""

    name: str
    policy: Policy
    kbs: dict[str, KnowledgeBase]
    config: AgentConfig = field(default_factory=AgentConfig)
    vision: bool = field(default=False, metadata={"help": "the policy reads images (text-only policies refuse them)"})
    description: str = ""


@dataclass
class AgentServerLimits:
    """Per-request bounds of the agent server; every one exceeded is a 4xx naming it."""

    max_body_bytes: int = 16 << 20
    max_concurrent: int = 16
    max_messages: int = 64
    max_text_chars: int = 8000
    max_tokens: int = 4096
    max_steps: int = 8
    max_context_turns: int = 4
    images: ImageLimits = field(default_factory=ImageLimits)


class KbrouterOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_steps: StrictInt | None = Field(None, ge=0)
    kbs: list[str] | None = Field(None, min_length=1)


class AgentChatRequest(BaseModel):
    """The chat-completions fields the agent server reads."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    n: Literal[1] = 1
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    seed: StrictInt | None = None
    kbrouter: KbrouterOptions | None = None


class _Cancelled(Exception):
    """The request's client went away; raised inside the agent's thread to stop it at the next step boundary."""


class _Bridge:
    """Lets an agent running in a worker thread submit items to a micro-batcher living on the event loop."""

    def __init__(self, batcher: MicroBatcher, loop: asyncio.AbstractEventLoop, cancelled: threading.Event) -> None:
        self.batcher, self.loop, self.cancelled = batcher, loop, cancelled

    def call(self, payloads: list, key: Hashable | list[Hashable]) -> list:
        """Submit `payloads` under one batcher key, or a list of keys, one per payload."""
        if self.cancelled.is_set():
            raise _Cancelled()
        keys = key if isinstance(key, list) else [key] * len(payloads)

        async def submit() -> list:
            futures = [self.batcher.submit(p, k) for p, k in zip(payloads, keys, strict=True)]
            try:
                return await asyncio.gather(*futures, return_exceptions=True)
            except asyncio.CancelledError:
                for f in futures:
                    f.cancel()  # still-queued items are dropped by the batcher
                raise

        fut = asyncio.run_coroutine_threadsafe(submit(), self.loop)
        while True:
            try:
                return fut.result(timeout=0.1)
            except concurrent.futures.TimeoutError:
                if self.cancelled.is_set():
                    fut.cancel()
                    raise _Cancelled() from None


class _BatchedPolicy:
    """The policy as one request's agent sees it: generate calls go through the shared batcher."""

    def __init__(self, inner: Policy, bridge: _Bridge) -> None:
        self.name = inner.name
        self.supports_grammar = supports_grammar(inner)
        self.bridge = bridge

    def generate(self, conversations: list[list[dict]], params: SamplingParams) -> list[Completion]:
        # one key per conversation: a grammar tuple's rows each batch with the work of their own grammar only
        outs = self.bridge.call(conversations, per_row_params(params, len(conversations)))
        for out in outs:
            if isinstance(out, BaseException):
                raise BackendError(f"generation failed: {out}")
        return outs


class _BatchedRetriever:
    def __init__(self, bridge: _Bridge) -> None:
        self.bridge = bridge

    def search(self, queries: list[str | Query], k: int) -> list[list[Hit]]:
        outs = self.bridge.call([q if isinstance(q, Query) else Query(text=q) for q in queries], k)
        for out in outs:
            if isinstance(out, BaseException):
                raise out
        return outs


def _error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):  # noqa: ANN202
    from fastapi.responses import JSONResponse

    return JSONResponse(error_payload(message, kind, code), status_code=status)


def _turns(messages: list[ChatMessage]) -> list[Turn]:
    out = []
    for m in messages:
        if isinstance(m.content, str):
            out.append(Turn(m.role, m.content))
            continue
        texts = [p.text for p in m.content if isinstance(p, TextPart)]
        images = [
            p.image_url.url if isinstance(p.image_url, ImageURL) else p.image_url
            for p in m.content
            if not isinstance(p, TextPart)
        ]
        out.append(Turn(m.role, "\n".join(texts), tuple(images)))
    return out


def create_agent_app(  # noqa: ANN201 (FastAPI app)
    setups: list[AgentSetup],
    *,
    api_keys: tuple[str, ...] = (),
    limits: AgentServerLimits | None = None,
    media_roots: list[str | Path] = (),
    allow_remote_images: bool = False,
    max_batch: int = 32,
    gather_s: float = 0.01,
):
    """The FastAPI app: `/` (page), /v1/models, /v1/chat/completions, /media/..., /health.

    Args:
        setups: the models offered (names must be unique).
        api_keys: accepted Bearer keys (empty: open).
        limits: request bounds.
        media_roots: folders whose files hits may link to (the KBs' media folders).
        allow_remote_images: fetch `http(s)://` image URLs sent by clients.
        max_batch, gather_s: micro-batching of generate calls and searches across requests.
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, StreamingResponse

    if not setups:
        raise ValueError("the agent server needs at least one agent setup")
    by_name = {s.name: s for s in setups}
    if len(by_name) != len(setups):
        raise ValueError(f"agent setup names must be unique, got {[s.name for s in setups]}")
    lim = limits or AgentServerLimits()
    media = MediaRoots(media_roots)
    uploads = ImageUploads(limits=lim.images, allow_remote=allow_remote_images)
    policy_batchers: dict[int, MicroBatcher] = {}
    kb_batchers: dict[int, MicroBatcher] = {}
    for s in setups:
        policy_batchers.setdefault(
            id(s.policy),
            MicroBatcher(s.policy.generate, name=f"policy {s.policy.name}", max_batch=max_batch, max_wait_s=gather_s),
        )
        for kb in s.kbs.values():
            kb_batchers.setdefault(
                id(kb.retriever),
                MicroBatcher(kb.retriever.search, name=f"KB {kb.name}", max_batch=max_batch, max_wait_s=gather_s),
            )
    batchers = [*policy_batchers.values(), *kb_batchers.values()]
    # agent runs block a thread each while they wait on the batchers, which use the default executor: a pool of
    # their own keeps them from starving it
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=lim.max_concurrent, thread_name_prefix="agent-run")
    stats = {"runs": 0, "cancelled": 0, "errors": 0}

    @contextlib.asynccontextmanager
    async def lifespan(app):  # noqa: ANN001, ANN202
        for b in batchers:
            b.start()
        yield
        for b in batchers:
            await b.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        uploads.close()

    app = FastAPI(title="kbrouter agent server", lifespan=lifespan, redirect_slashes=False)
    app.state.stats = stats

    @app.get("/")
    async def page() -> HTMLResponse:
        return HTMLResponse((WEB_DIR / "index.html").read_text(encoding="utf-8"))

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = all(b.healthy for b in batchers)
        payload = {"status": "ok" if ok else "unhealthy", "models": list(by_name), **stats}
        return JSONResponse(payload, status_code=200 if ok else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(s) for s in setups]}

    @app.get("/media/{index}/{rel:path}")
    async def media_file(index: int, rel: str, sig: str = ""):  # noqa: ANN202
        try:
            path = media.resolve(index, rel, sig)
        except PermissionError as e:
            return _error(403, str(e), "permission_error")
        except FileNotFoundError as e:
            return _error(404, str(e), "not_found_error")
        return FileResponse(path)

    def prepare(body: object) -> tuple[AgentSetup, AgentConfig, dict[str, KnowledgeBase], Question]:
        """Validate a request into (setup, loop settings, KBs, question); raises ValueError/LookupError."""
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object with `model` and a non-empty `messages` list")
        if isinstance(body.get("messages"), list) and len(body["messages"]) > lim.max_messages:
            raise ValueError(f"messages: {len(body['messages'])} messages; at most {lim.max_messages} are accepted")
        try:
            req = AgentChatRequest.model_validate(body)
        except ValidationError as e:
            raise ValueError(validation_message(e)) from None
        if req.model is None and len(setups) == 1:
            setup = setups[0]
        elif req.model not in by_name:
            raise LookupError(f"model {req.model!r} is not served here; GET /v1/models lists {sorted(by_name)}")
        else:
            setup = by_name[req.model]
        turns = _turns(req.messages)
        for i, t in enumerate(turns):
            if len(t.text) > lim.max_text_chars:
                raise ValueError(f"messages.{i}: {len(t.text)} characters; at most {lim.max_text_chars}")
        text = question_text(turns, lim.max_context_turns)
        refs = latest_images(turns)
        if refs and not setup.vision:
            raise ValueError(
                f"model {setup.name!r} has a text-only policy and cannot read images; drop the image or pick a "
                "model with a vision-language policy"
            )
        if len(refs) > lim.images.max_images:
            raise ValueError(f"{len(refs)} images in the question; at most {lim.images.max_images}")
        images = tuple(str(uploads.save(r)) for r in refs)
        cfg = setup.config
        opts = req.kbrouter or KbrouterOptions()
        if opts.max_steps is not None:
            if opts.max_steps > lim.max_steps:
                raise ValueError(
                    f"kbrouter.max_steps: {opts.max_steps} is over this server's limit of {lim.max_steps}"
                )
            cfg = replace(cfg, max_steps=opts.max_steps, min_steps=min(cfg.min_steps, opts.max_steps))
        max_tokens = req.max_completion_tokens or req.max_tokens
        if max_tokens is not None:
            if max_tokens > lim.max_tokens:
                raise ValueError(f"max_tokens: {max_tokens} is over this server's limit of {lim.max_tokens}")
            cfg = replace(cfg, final_tokens=min(cfg.final_tokens, max_tokens))
        if req.temperature is not None:
            cfg = replace(cfg, temperature=req.temperature)
        if req.seed is not None:
            cfg = replace(cfg, seed=req.seed)
        kbs = setup.kbs
        if opts.kbs is not None:
            kbs, unknown = {}, []
            for n in opts.kbs:
                try:
                    display = kb_id(n, setup.kbs.values(), "display_name")
                except ValueError:  # not a KB of this model (or one KB's name and another's display name)
                    unknown.append(n)
                else:
                    kbs[display] = setup.kbs[display]
            if unknown:
                names = sorted(kb.name for kb in setup.kbs.values())
                raise ValueError(f"kbrouter.kbs: unknown KB(s) {sorted(unknown)}; model {setup.name!r} has {names}")
        question = Question(id=f"chat-{uuid.uuid4().hex[:12]}", question=text, images=images)
        return setup, cfg, kbs, question

    def start_run(setup: AgentSetup, cfg: AgentConfig, kbs: dict[str, KnowledgeBase], question: Question, on_event):  # noqa: ANN001, ANN202
        loop = asyncio.get_running_loop()
        cancelled = threading.Event()
        policy = _BatchedPolicy(setup.policy, _Bridge(policy_batchers[id(setup.policy)], loop, cancelled))
        wrapped = {
            d: replace(kb, retriever=_BatchedRetriever(_Bridge(kb_batchers[id(kb.retriever)], loop, cancelled)))
            for d, kb in kbs.items()
        }
        agent = StepAgent(policy, wrapped, cfg)  # a bad setting (e.g. max_tokens too small for the tags) fails here

        def work() -> Trajectory:
            def emit(sid: str, event: str, payload: dict) -> None:
                if cancelled.is_set():
                    raise _Cancelled()
                if on_event is not None:
                    loop.call_soon_threadsafe(on_event, event, payload)

            return agent.run_batch([question], on_event=emit)[0]

        stats["runs"] += 1
        run = loop.run_in_executor(pool, work)
        run.add_done_callback(lambda f: f.cancelled() or f.exception())  # a cancelled run's error is expected
        return run, cancelled

    @app.post("/v1/chat/completions")
    async def chat(request: Request):  # noqa: ANN202
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _error(400, f"body is not valid JSON: {e}")
        except RecursionError:  # `[[[[...` thousands deep
            return _error(400, "body is not valid JSON: nested too deeply")
        try:
            setup, cfg, kbs, question = prepare(body)
            stream = bool(body.get("stream"))
            events: asyncio.Queue = asyncio.Queue()
            run, cancelled = start_run(
                setup, cfg, kbs, question, (lambda e, p: events.put_nowait((e, p))) if stream else None
            )
        except LookupError as e:
            return _error(404, str(e), code="model_not_found")
        except ValueError as e:
            return _error(400, str(e))
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())
        if stream:
            return StreamingResponse(
                stream_chunks(run, cancelled, events, setup.name, cid, created, media, kbs, stats),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        try:
            while True:
                done, _ = await asyncio.wait({run}, timeout=0.1)
                if done:
                    break
                if await request.is_disconnected():
                    cancelled.set()
                    stats["cancelled"] += 1
                    return _error(499, "client disconnected")
            traj = run.result()
        except Exception as e:
            stats["errors"] += 1
            logger.exception("agent run failed")
            return _error(500, f"the agent failed: {e}", "server_error")
        finally:
            cancelled.set()  # nothing more to do either way; a run still going stops at its next step
        if traj.stop_reason == "backend_error":
            stats["errors"] += 1
            return _error(502, f"the policy or a KB failed: {traj.metadata.get('error', '')}", "server_error")
        payload = completion(cid, created, setup.name, traj, media, kbs)
        return JSONResponse(payload)

    guard = Guard(app, keys=api_keys, limits=RequestLimits(lim.max_body_bytes, lim.max_concurrent), public={"/"},
                  authorized=media.signed)  # fmt: skip
    guard.fastapi = app  # tests and benchmarks read app.state.stats
    return guard


def _model_card(s: AgentSetup) -> dict:
    kbs = [{"name": kb.name, "display_name": kb.display_name, "description": kb.description} for kb in s.kbs.values()]
    info = {"kbs": kbs, "max_steps": s.config.max_steps, "vision": s.vision, "policy": s.policy.name}
    return {"id": s.name, "object": "model", "owned_by": "kbrouter", "description": s.description, "kbrouter": info}


def load_setups(
    args: argparse.Namespace,
    make_policy: Callable[[PolicyConfig], Policy],
    load_kbs: Callable[[str], dict[str, KnowledgeBase]],
) -> tuple[list[AgentSetup], list[str]]:
    """The setups the flags ask for, and their KB files: the main one (`--kb`, `--config`, policy flags) and one per
    `--setup NAME=CONFIG` (a `--config` YAML with `policy`, `agent` and `kb`). Equal policy configs share one loaded
    policy (and one batcher), equal KB files one loaded KB set."""
    from agent.cli import resolve_configs

    specs = [(args.name, args)]
    for item in args.setup:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--setup {item!r}: expected NAME=CONFIG_YAML, e.g. --setup vl=configs/agent/vl.yaml")
        blank = argparse.Namespace(**{k: None for k in vars(args)})
        specs.append((name, argparse.Namespace(**{**vars(blank), "config": path})))
    policies: dict[PolicyConfig, Policy] = {}
    kb_sets: dict[str, dict[str, KnowledgeBase]] = {}
    setups = []
    for name, ns in specs:
        pol_cfg, agent_cfg, kb_file = resolve_configs(ns)
        if pol_cfg not in policies:
            policies[pol_cfg] = make_policy(pol_cfg)
        if kb_file not in kb_sets:
            kb_sets[kb_file] = load_kbs(kb_file)
        vision = ns.vision if ns.vision is not None else pol_cfg.backend == "vl"
        setups.append(
            AgentSetup(
                name or f"kbrouter-{Path(kb_file).stem}",
                policies[pol_cfg],
                kb_sets[kb_file],
                agent_cfg,
                vision=vision,
                description=f"{pol_cfg.model} ({pol_cfg.backend}) over {Path(kb_file).name}",
            )
        )
    return setups, list(kb_sets)


def main(argv: list[str] | None = None) -> int:
    """Load the policies and KB sets and serve the agent (OpenAI chat completions and the page)."""
    from agent.backends.factory import make_policy
    from agent.cli import add_common_args
    from agent.kbs import load_knowledge_bases
    from retrievers.config import load_kb_configs
    from retrievers.security import add_security_args, kb_media_folders, resolve_api_keys, warn_if_exposed
    from retrievers.serving import add_drain_args, serve_until_signalled

    ap = argparse.ArgumentParser(prog="kbrouter serve-agent", description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--name", help="the model name clients send (default: kbrouter-<KB file stem>)")
    ap.add_argument("--setup", action="append", default=[], metavar="NAME=CONFIG",
                    help="serve another model NAME from a --config YAML (policy, agent, kb); repeatable")  # fmt: skip
    ap.add_argument("--vision", action=argparse.BooleanOptionalAction, default=None,
                    help="the policy reads images (default: on for --backend vl)")  # fmt: skip
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT)
    ap.add_argument("--allow-remote-images", action="store_true", help="fetch http(s) image URLs sent by clients")
    defaults = AgentServerLimits()
    add_security_args(ap, defaults.max_body_bytes, defaults.max_concurrent)
    ap.add_argument("--max-messages", type=int, default=defaults.max_messages)
    ap.add_argument("--max-tokens-limit", type=int, default=defaults.max_tokens, help="largest max_tokens accepted")
    ap.add_argument("--max-steps-limit", type=int, default=defaults.max_steps, help="largest kbrouter.max_steps")
    ap.add_argument("--max-image-bytes", type=int, default=defaults.images.max_bytes)
    ap.add_argument("--max-image-pixels", type=int, default=defaults.images.max_pixels)
    add_drain_args(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")  # fmt: skip
    if not args.kb and not args.config:
        ap.error("pass --kb configs/kb/NAME.yaml (or --config with a `kb:` key)")
    keys = resolve_api_keys(args.api_key)
    setups, kb_files = load_setups(args, make_policy, load_knowledge_bases)
    limits = AgentServerLimits(
        max_body_bytes=args.max_body_bytes,
        max_concurrent=args.max_concurrent,
        max_messages=args.max_messages,
        max_tokens=args.max_tokens_limit,
        max_steps=args.max_steps_limit,
        images=ImageLimits(max_bytes=args.max_image_bytes, max_pixels=args.max_image_pixels),
    )
    media = [folder for f in kb_files for folder in kb_media_folders(load_kb_configs(f))]
    app = create_agent_app(
        setups, api_keys=keys, limits=limits, media_roots=media, allow_remote_images=args.allow_remote_images
    )
    warning = warn_if_exposed(args.host, keys, "kbrouter serve-agent")
    if warning:
        print(f"WARNING: {warning}")  # noqa: T201 - the person starting the server must see it
    names = ", ".join(s.name for s in setups)
    print(f"serving {names} at http://{args.host}:{args.port}/ (page) and /v1 (OpenAI chat completions)")  # noqa: T201
    return serve_until_signalled(app, args.host, args.port, drain_s=args.drain_s, name="kbrouter serve-agent")


if __name__ == "__main__":
    raise SystemExit(main())
