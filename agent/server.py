"""`kbrouter serve`: an OpenAI-compatible chat-completions endpoint over any kbrouter policy backend.

Concurrent requests with the same sampling settings are gathered for a few milliseconds and generated as one
batch, so many clients (synthesis workers, eval shards) share one model efficiently (`retrievers.batching`).
Bodies are checked by type and range before anything is queued (400 naming the field); a request whose generation
fails fails alone; a client that disconnects before its turn costs no generation.

Security (`retrievers.security`): `--api-key` (or `$KBROUTER_API_KEY`) is required as a Bearer token on every route;
bodies over `--max-body-bytes` are a 413, more than `--max-concurrent` requests at once a 429. Images arrive as data
URLs, checked for bytes and pixels and written to a server-owned folder; a path or `file://` URL is read only inside
an `--image-root` folder, and `http(s)://` URLs are fetched only with `--allow-remote-images`.

Scoring: a request in vLLM's form for scoring a continuation (`prompt_logprobs: 0`, `continue_final_message: true`,
`add_generation_prompt: false`, the text to score as the last assistant message) is answered with each prompt
token's log-probability (`prompt_logprobs`, and `prompt_token_ids` with `return_token_ids`) and no generation. A
client agent's route prior reads KB names this way (`OpenAICompatiblePolicy.continuation_logprobs`).
"""

import argparse
import logging
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, ValidationError

from agent.backends.base import Policy, SamplingParams, supports_grammar
from retrievers.batching import ClientGone, MicroBatcher, wait_or_cancel
from retrievers.security import Guard, ImageLimits, ImageUploads, RequestLimits

logger = logging.getLogger(__name__)

MAX_BATCH = 32
GATHER_S = 0.01
MAX_TOKENS_LIMIT = 8192
MAX_STOPS = 16
MAX_MESSAGES = 256
SCORE = "score"  # the batcher key of scoring requests (generation requests are keyed by their SamplingParams)


def _utf8(text: str) -> str:
    # JSON may carry lone surrogates ("\ud800"); tokenizers choke on them, so refuse them here, by field
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode ({e.reason} at index {e.start}); send UTF-8 text") from e
    return text


Text = Annotated[str, AfterValidator(_utf8)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we do not use (user, logprobs, ...)


class TextPart(_Model):
    type: Literal["text"]
    text: Text


class ImageURL(_Model):
    url: Text


class ImagePart(_Model):
    type: Literal["image_url"]
    image_url: ImageURL | Text


class ChatMessage(_Model):
    role: Literal["system", "user", "assistant", "tool"]
    content: Text | list[Annotated[TextPart | ImagePart, Field(discriminator="type")]]


class ChatRequest(_Model):
    """The chat-completions fields this server reads, checked by type and range before anything is queued."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: Literal[False] = False
    n: Literal[1] = 1
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: StrictInt | None = Field(0, ge=0)
    seed: StrictInt | None = None
    stop: Text | list[Text] | None = Field(None, max_length=MAX_STOPS)
    structured_outputs: Any = None
    ebnf: Any = None
    grammar: Any = None
    # kbrouter's extension: the agent step being decoded, so a policy served with a plan adapter picks its weights
    kbrouter_step: Literal["plan", "answer", "final"] | None = None
    # vLLM's extensions for scoring a continuation: the last (assistant) message rendered open, and each prompt
    # token's log-probability in the reply (what `agent.route_prior` reads from a served policy)
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    prompt_logprobs: StrictInt | None = Field(None, ge=0)
    return_token_ids: bool = False


_HINTS = {"stream": "stream=true is not supported; send stream=false", "n": "only n=1 is supported"}


def validation_message(error: ValidationError) -> str:
    """One line naming each bad field (union and tag names dropped from the path)."""
    lines = []
    for e in error.errors():
        loc = [str(p) for p in e["loc"] if isinstance(p, int) or ("[" not in p and p not in {"str", "ImageURL"})]
        field = ".".join(loc) or "body"
        msg = _HINTS.get(field, e["msg"])
        if f"{field}: {msg}" not in lines:
            lines.append(f"{field}: {msg}")
    return "; ".join(lines[:5])


def _to_kbrouter_messages(messages: list[ChatMessage], uploads: ImageUploads) -> list[dict]:
    """OpenAI content parts → kbrouter's (`image_url` → `{"type": "image", "image": checked local path}`)."""
    out, images = [], 0
    for m in messages:
        content = m.content
        if isinstance(content, list):
            parts = []
            for p in content:
                if isinstance(p, TextPart):
                    parts.append({"type": "text", "text": p.text})
                    continue
                images += 1
                if images > uploads.limits.max_images:
                    raise ValueError(f"more than {uploads.limits.max_images} images in one request")
                url = p.image_url.url if isinstance(p.image_url, ImageURL) else p.image_url
                parts.append({"type": "image", "image": str(uploads.save(url))})
            content = parts
        out.append({"role": m.role, "content": content})
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


def scoring_request(req: ChatRequest, policy: Policy) -> bool:
    """Whether a request asks for its prompt's log-probabilities, which this server answers by scoring alone (no
    generation): vLLM's `prompt_logprobs: 0` with `continue_final_message`, the form a client scoring continuations
    sends. Any other use of these fields is refused, naming what is supported."""
    if req.prompt_logprobs is None:
        if req.continue_final_message or not req.add_generation_prompt:
            raise ValueError(
                "continue_final_message / add_generation_prompt: false are supported for scoring only "
                "(with prompt_logprobs: 0)"
            )
        return False
    if req.prompt_logprobs != 0:
        raise ValueError("prompt_logprobs: only 0 is supported (each prompt token's own log-probability)")
    if not (req.continue_final_message and not req.add_generation_prompt and req.messages[-1].role == "assistant"):
        raise ValueError(
            "prompt_logprobs scores a continuation: send continue_final_message: true, add_generation_prompt: false "
            "and the text to score as the last (assistant) message"
        )
    if not hasattr(policy, "prompt_logprobs"):
        raise ValueError(f"this server's policy ({type(policy).__name__}) cannot score prompts; drop prompt_logprobs")
    return True


def _status_of(error: BaseException) -> tuple[int, str]:
    """HTTP status and message for one failed request: its own bad input is a 422, anything else a 500."""
    if isinstance(error, (ValueError, TypeError)):
        return 422, f"this request's input was rejected: {error}"
    return 500, f"generation failed: {error}"


def scoring_reply(name: str, ids: list[int], logprobs: list[float | None], token_ids: bool, tokenizer: Any) -> dict:
    """A scoring request's reply, in vLLM's shape: no generated text, each prompt token's log-probability keyed by
    its id (`prompt_logprobs`, None for the first token) and, when asked, the prompt's ids."""
    scored = [
        None
        if lp is None
        else {str(i): {"logprob": lp, "decoded_token": tokenizer.decode([i]) if tokenizer is not None else None}}
        for i, lp in zip(ids, logprobs, strict=True)
    ]
    reply = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)},
        "prompt_logprobs": scored,
    }
    if token_ids:
        reply["prompt_token_ids"] = ids
    return reply


def create_app(  # noqa: ANN201 (an ASGI app)
    policy: Policy,
    model_name: str | None = None,
    max_tokens_limit: int = MAX_TOKENS_LIMIT,
    *,
    api_keys: tuple[str, ...] = (),
    limits: RequestLimits | None = None,
    max_messages: int = MAX_MESSAGES,
    image_limits: ImageLimits | None = None,
    image_roots: tuple[str, ...] = (),
    allow_remote_images: bool = False,
):
    """The app: POST /v1/chat/completions, GET /v1/models, GET /health, behind `retrievers.security.Guard`.

    Args:
        policy: the backend that generates.
        model_name: the name clients send as `model` (default: the policy's).
        max_tokens_limit: the largest `max_tokens` accepted (400 above), so one request cannot hold the model.
        api_keys: accepted Bearer keys (empty: open).
        limits: body size (413) and concurrent requests (429).
        max_messages: most messages in one request.
        image_limits: bytes, pixels and count of a request's images.
        image_roots: folders whose files a request may name by path (default none: data URLs only).
        allow_remote_images: fetch `http(s)://` image URLs.
    """
    import contextlib

    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse

    name = model_name or policy.name
    uploads = ImageUploads(limits=image_limits, allowed_roots=image_roots, allow_remote=allow_remote_images)

    def run(payloads: list, key: object) -> list:
        if isinstance(key, tuple) and key[:1] == (SCORE,):  # scoring requests share the model's one worker thread
            return policy.prompt_logprobs(payloads, step=key[1])  # type: ignore[attr-defined]
        return policy.generate(payloads, key)  # type: ignore[arg-type]

    batcher = MicroBatcher(run, name="policy-batcher", max_batch=MAX_BATCH, max_wait_s=GATHER_S)

    @contextlib.asynccontextmanager
    async def lifespan(app):  # noqa: ANN001, ANN202
        batcher.start()
        yield
        await batcher.stop()
        uploads.close()

    app = FastAPI(title="kbrouter policy server", lifespan=lifespan)
    app.state.batcher = batcher

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = batcher.healthy
        payload = {"status": "ok" if ok else "unhealthy", "model": name, "batcher_restarts": batcher.restarts}
        return JSONResponse(payload, status_code=200 if ok else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "kbrouter"}]}

    def parse(body: object) -> tuple[list[dict], SamplingParams | tuple, bool]:
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object with a non-empty 'messages' list")
        if isinstance(body.get("messages"), list) and len(body["messages"]) > max_messages:
            raise ValueError(f"messages: {len(body['messages'])} messages; at most {max_messages} are accepted")
        try:
            req = ChatRequest.model_validate(body)
        except ValidationError as e:
            raise ValueError(validation_message(e)) from None
        if scoring_request(req, policy):
            return _to_kbrouter_messages(req.messages, uploads), (SCORE, req.kbrouter_step), req.return_token_ids
        grammar = request_grammar(body)
        if grammar and not supports_grammar(policy):
            raise ValueError(f"this server's policy ({name}) has no structured output; drop the grammar field")
        max_tokens = next((v for v in (req.max_tokens, req.max_completion_tokens) if v is not None), 256)
        if max_tokens > max_tokens_limit:
            raise ValueError(f"max_tokens: {max_tokens} is over this server's limit of {max_tokens_limit}")
        stop = req.stop or ()
        params = SamplingParams(
            max_new_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k or 0,
            seed=req.seed,
            stop=() if grammar else (stop,) if isinstance(stop, str) else tuple(stop),
            grammar=grammar,
            step=req.kbrouter_step,
        )
        return _to_kbrouter_messages(req.messages, uploads), params, False

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        try:
            messages, params, token_ids = parse(await request.json())
            future = batcher.submit(messages, params)
        except (ValueError, TypeError) as e:
            raise HTTPException(status_code=400, detail=str(e)) from e
        except RecursionError as e:  # json.loads on `[[[[...` thousands deep
            raise HTTPException(status_code=400, detail="body is not valid JSON: nested too deeply") from e
        try:
            (out,) = await wait_or_cancel([future], request)
        except ClientGone:
            return JSONResponse({"detail": "client disconnected"}, status_code=499)
        if isinstance(out, BaseException):
            status, detail = _status_of(out)
            raise HTTPException(status_code=status, detail=detail)
        if isinstance(params, tuple):
            return JSONResponse(scoring_reply(name, *out, token_ids, getattr(policy, "tokenizer", None)))
        if out.finish_reason == "error":  # a backend that fails one item in place (e.g. an unreadable image)
            bad_input = out.metadata.get("bad_input", False)
            raise HTTPException(status_code=422 if bad_input else 502, detail=out.metadata.get("error", "failed"))
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

    guard = Guard(app, keys=api_keys, limits=limits)
    guard.state = app.state
    return guard


def main(argv: list[str] | None = None) -> int:
    """Serve a policy over HTTP (OpenAI chat-completions API)."""
    from agent.backends.factory import PolicyConfig, make_policy
    from retrievers.security import add_security_args, resolve_api_keys, warn_if_exposed
    from retrievers.serving import add_drain_args, serve_until_signalled

    ap = argparse.ArgumentParser(prog="kbrouter serve", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="hub name, local folder, or `smollm2` (default)")
    ap.add_argument("--backend", default="transformers", choices=["transformers", "vl", "vllm"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--adapter", default=None, help="transformers backend: a peft (LoRA) adapter folder for `--model`")
    ap.add_argument(
        "--plan-adapter",
        default=None,
        help="transformers backend: a second adapter for requests marked `kbrouter_step: plan` (clients: policy.send_step)",
    )
    ap.add_argument("--served-model-name", default=None, help="name clients send as `model`")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-tokens-limit", type=int, default=MAX_TOKENS_LIMIT, help="largest max_tokens accepted")
    ap.add_argument("--max-messages", type=int, default=MAX_MESSAGES, help="most messages in one request")
    ap.add_argument(
        "--image-root", action="append", default=[], help="a folder whose images requests may name by path"
    )
    ap.add_argument("--allow-remote-images", action="store_true", help="fetch http(s) image URLs sent by clients")
    add_security_args(ap, RequestLimits.max_body_bytes * 16, RequestLimits.max_concurrent)
    add_drain_args(ap)
    args = ap.parse_args(argv)
    keys = resolve_api_keys(args.api_key)
    policy = make_policy(
        PolicyConfig(
            backend=args.backend,
            model=args.model,
            dtype=args.dtype,
            adapter=args.adapter,
            plan_adapter=args.plan_adapter,
        )
    )
    app = create_app(
        policy,
        args.served_model_name or args.model,
        args.max_tokens_limit,
        api_keys=keys,
        limits=RequestLimits(args.max_body_bytes, args.max_concurrent),
        max_messages=args.max_messages,
        image_roots=tuple(args.image_root),
        allow_remote_images=args.allow_remote_images,
    )
    warning = warn_if_exposed(args.host, keys, "kbrouter serve")
    if warning:
        print(f"WARNING: {warning}")  # noqa: T201 - the person starting the server must see it
    print(f"serving {args.model} at http://{args.host}:{args.port}/v1 (OpenAI chat completions)")  # noqa: T201 - the one line a person starting the server reads
    return serve_until_signalled(app, args.host, args.port, drain_s=args.drain_s, name="kbrouter serve")


if __name__ == "__main__":
    raise SystemExit(main())
