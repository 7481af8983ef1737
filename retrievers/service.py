"""A shared retrieval service: loaded KBs behind one HTTP batch-search endpoint (`kbrouter serve-retrieval`).

RL rollouts, synthesis and eval on many workers share one set of loaded indexes instead of each process loading
its own. Queries that arrive close together are encoded together: each KB has a micro-batcher that collects
queries for up to `max_wait_ms` (or `max_batch` queries), then makes one `search` call per (KB, k).

Endpoints::

    POST /search   {"queries": [{"kb": "text", "text": "...", "image": null, "k": 5}, ...]}
                   -> {"results": [[Hit.to_dict(), ...], ...]}   (one list per query, in order)
    GET  /kbs      the served KBs and their default k
    GET  /health   {"status": "ok", ...}
    GET  /metrics  request counts by status, per-KB query counts and p50/p99 latency, batch sizes

Security (`retrievers.security`): with `--api-key` (or `$KBROUTER_API_KEY`) every route needs the Bearer key (401);
more than `max_concurrent` requests at once get a 429; a query image must be a file inside a KB media folder or an
`--image-root` (the service reads no other path a client names, and fetches no URL).

Bad requests get a 4xx with a message (413 body too large, 422 malformed or out of bounds, 404 unknown KB);
the service keeps serving. A query that breaks its KB's search fails only its own request (batching,
`retrievers.batching`), and `/health` is 503 while a KB's batcher is down (it is restarted). Run it (CPU or GPU, whatever the KBs use)::

    kbrouter serve-retrieval --kb configs/kb/demo.yaml --host 127.0.0.1 --port 8765
    python -m retrievers.service --kb configs/kb/demo.yaml --port 8765 --record runs/snapshot.jsonl

and point a KB at it with `options: {remote: http://127.0.0.1:8765}` (see `retrievers.remote`).
"""

# No `from __future__ import annotations`: FastAPI must resolve the `Request` annotation of the handlers.

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from retrievers.batching import ClientGone, MicroBatcher, QueueFull, wait_or_cancel
from retrievers.media import ImageTooLarge, MediaError, check_image_pixels
from retrievers.security import Guard, RequestLimits, inside_roots
from retrievers.serving import add_drain_args, serve_until_signalled
from retrievers.types import Query, Retriever

logger = logging.getLogger(__name__)


@dataclass
class ServiceConfig:
    """Bounds and batching of the retrieval service."""

    max_body_bytes: int = field(default=1 << 20, metadata={"help": "Largest request body accepted (413 above)."})
    max_queries: int = field(default=512, metadata={"help": "Most queries in one request."})
    max_text_chars: int = field(default=4096, metadata={"help": "Longest query text accepted."})
    max_k: int = field(default=100, metadata={"help": "Largest k accepted."})
    max_batch: int = field(default=256, metadata={"help": "Most queries encoded in one micro-batch."})
    max_wait_ms: float = field(default=5.0, metadata={"help": "How long a micro-batch waits for more queries."})
    max_pending: int = field(default=8192, metadata={"help": "Queued queries per KB before answering 503."})
    latency_window: int = field(default=10000, metadata={"help": "Latencies kept per KB for p50/p99."})
    max_concurrent: int = field(default=256, metadata={"help": "Requests handled at once (429 above)."})

    def __post_init__(self) -> None:
        for key in (
            "max_body_bytes",
            "max_queries",
            "max_text_chars",
            "max_k",
            "max_batch",
            "max_pending",
            "max_concurrent",
        ):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ServiceConfig `{key}` must be a positive integer, got {value!r}")
        if self.max_wait_ms < 0:
            raise ValueError(f"ServiceConfig `max_wait_ms` must be >= 0, got {self.max_wait_ms!r}")


class RequestError(Exception):
    """A request the service rejects; `status` is the HTTP code (4xx) and the message says what to fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_search_request(
    body: bytes,
    kbs: dict[str, Retriever],
    default_k: dict[str, int],
    cfg: ServiceConfig,
    image_roots: list[Path] | None = None,
):
    """Validate a /search body into `[(kb, Query, k), ...]`; raises `RequestError` naming the first problem.

    `image_roots`, when given, are the only folders a query image may lie in (403 otherwise)."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"body is not valid JSON: {e}") from e
    except RecursionError as e:  # `[[[[...` thousands deep
        raise RequestError(400, "body is not valid JSON: nested too deeply") from e
    if not isinstance(data, dict) or not isinstance(data.get("queries"), list):
        raise RequestError(422, 'expected {"queries": [{"kb": ..., "text": ..., "k": ...}, ...]}')
    unknown_top = sorted(set(data) - {"queries"})
    if unknown_top:
        raise RequestError(422, f"unknown top-level key(s) {unknown_top}; only `queries` is read")
    queries = data["queries"]
    if not queries:
        raise RequestError(422, "`queries` is empty; send at least one query")
    if len(queries) > cfg.max_queries:
        raise RequestError(422, f"{len(queries)} queries in one request; at most {cfg.max_queries} (split it)")
    out = []
    for i, q in enumerate(queries):
        where = f"queries[{i}]"
        if not isinstance(q, dict):
            raise RequestError(422, f"{where}: expected an object, got {type(q).__name__}")
        unknown = sorted(set(q) - {"kb", "text", "image", "k"})
        if unknown:
            raise RequestError(422, f"{where}: unknown key(s) {unknown}; valid: kb, text, image, k")
        kb, text, image, k = q.get("kb"), q.get("text"), q.get("image"), q.get("k")
        if not isinstance(kb, str):
            raise RequestError(422, f"{where}.kb: expected a string KB name, got {kb!r}")
        if kb not in kbs:
            raise RequestError(404, f"{where}.kb: unknown KB {kb!r}; served KBs: {sorted(kbs)}")
        if not isinstance(text, str):
            raise RequestError(422, f"{where}.text: expected a string, got {type(text).__name__}")
        _check_unicode(text, f"{where}.text")
        if not text.strip():
            raise RequestError(422, f"{where}.text is empty; send a non-empty query (or skip it client-side)")
        if len(text) > cfg.max_text_chars:
            raise RequestError(422, f"{where}.text has {len(text)} characters; at most {cfg.max_text_chars}")
        if image is not None and not isinstance(image, str):
            raise RequestError(422, f"{where}.image: expected a path string or null, got {type(image).__name__}")
        if image is not None:
            _check_unicode(image, f"{where}.image")
            if image_roots is not None:
                real = inside_roots(Path(image), image_roots)
                if real is None:
                    raise RequestError(
                        403,
                        f"{where}.image: not a file inside this service's image folders (its KBs' media folders "
                        "and --image-root); the service reads no other path and fetches no URL",
                    )
                image = str(real)
            _check_image(image, f"{where}.image")
        if k is None:
            k = default_k.get(kb, 5)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= cfg.max_k:
            raise RequestError(422, f"{where}.k: expected an integer in [1, {cfg.max_k}], got {k!r}")
        out.append((kb, Query(text=text, image=image), k))
    return out


def _check_unicode(text: str, where: str) -> None:
    # JSON can carry lone surrogates ("\ud800"); encoders choke on them, so refuse them here, by field
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(422, f"{where}: not valid Unicode ({e.reason} at index {e.start}); send UTF-8 text") from e


def _check_image(path: str, where: str) -> None:
    # header only: a decompression bomb is refused before any KB decodes it; a missing or unreadable file is left
    # to the KB, which searches by the text alone
    try:
        check_image_pixels(path)
    except ImageTooLarge as e:
        raise RequestError(422, f"{where}: {e}") from e
    except (FileNotFoundError, MediaError):
        pass


class KBStats:
    """Rolling per-KB counters: queries served, errors, latencies (enqueue to answer) and batch sizes."""

    def __init__(self, window: int) -> None:
        self.queries = 0
        self.errors = 0
        self.batches = 0
        self.latencies_ms: collections.deque[float] = collections.deque(maxlen=window)
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=window)

    def record_batch(self, size: int) -> None:
        self.batches += 1
        self.batch_sizes.append(size)

    def watch(self, future: asyncio.Future) -> asyncio.Future:
        """Count `future`'s query when it is answered (latency from now) or fails; returns it."""
        t0 = time.perf_counter()

        def done(f: asyncio.Future) -> None:
            if f.cancelled():
                return
            if f.exception() is not None:
                self.errors += 1
            else:
                self.queries += 1
                self.latencies_ms.append((time.perf_counter() - t0) * 1000)

        future.add_done_callback(done)
        return future

    def snapshot(self) -> dict:
        lat = np.asarray(self.latencies_ms, dtype=np.float64)
        sizes = np.asarray(self.batch_sizes, dtype=np.float64)
        return {
            "queries": self.queries,
            "errors": self.errors,
            "batches": self.batches,
            "latency_ms_p50": round(float(np.percentile(lat, 50)), 3) if lat.size else None,
            "latency_ms_p99": round(float(np.percentile(lat, 99)), 3) if lat.size else None,
            "batch_size_mean": round(float(sizes.mean()), 2) if sizes.size else None,
            "batch_size_max": int(sizes.max()) if sizes.size else None,
        }


def _failure(error: BaseException, where: str, kb: str) -> tuple[int, str]:
    """Status and message for one failed query: a query the KB rejects is a 422, a KB that breaks a 500."""
    if isinstance(error, asyncio.CancelledError):
        return 503, f"{where}: KB {kb!r} is shutting down; retry"
    if isinstance(error, (ValueError, TypeError)):
        return 422, f"{where}: KB {kb!r} rejected this query: {error}"
    return 500, f"{where}: search failed on KB {kb!r}: {error}"


async def _read_body(request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"request body of {declared} bytes is over the limit of {limit}; split the batch")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"request body is over the limit of {limit} bytes; split the batch")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(
    kbs: dict[str, Retriever],
    config: ServiceConfig | None = None,
    kb_info: dict[str, dict] | None = None,
    *,
    api_keys: tuple[str, ...] = (),
    image_roots: list[str | Path] | None = None,
):
    """The app serving `kbs` (name -> retriever), behind `retrievers.security.Guard`.

    Args:
        kbs: loaded retrievers by KB name (what clients send as `kb`).
        config: bounds and batching; defaults to `ServiceConfig()`.
        kb_info: optional facts per KB for GET /kbs (e.g. display_name, kind, k); `k` is the default k.
        api_keys: accepted Bearer keys (empty: open).
        image_roots: folders query images must lie in (None: any path, for in-process use; the CLI always sets it).
    """
    try:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse
    except ImportError as e:
        raise ImportError("the retrieval service needs FastAPI and uvicorn: pip install fastapi uvicorn") from e

    cfg = config or ServiceConfig()
    roots = None if image_roots is None else [Path(r).resolve() for r in image_roots]
    info = {name: dict((kb_info or {}).get(name, {})) for name in kbs}
    default_k = {name: int(info[name].get("k", 5)) for name in kbs}
    stats = {name: KBStats(cfg.latency_window) for name in kbs}
    status_counts: collections.Counter[int] = collections.Counter()
    request_ms: collections.deque[float] = collections.deque(maxlen=cfg.latency_window)
    batchers = {
        name: MicroBatcher(
            retriever.search,  # keyed by k: queries with different k go in separate calls
            name=f"KB {name!r}",
            max_batch=cfg.max_batch,
            max_wait_s=cfg.max_wait_ms / 1000,
            max_pending=cfg.max_pending,
            on_batch=stats[name].record_batch,
        )
        for name, retriever in kbs.items()
    }
    started = time.time()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        for b in batchers.values():
            b.start()
        logger.info("serving KBs %s with %s", sorted(kbs), asdict(cfg))
        yield
        for b in batchers.values():
            await b.stop()

    app = FastAPI(title="kbrouter retrieval service", lifespan=lifespan)
    app.state.batchers = batchers

    def reply(status: int, payload: dict) -> JSONResponse:  # counts /search answers by status
        status_counts[status] += 1
        return JSONResponse(payload, status_code=status)

    @app.post("/search")
    async def search(request: Request) -> JSONResponse:
        t0 = time.perf_counter()
        try:
            body = await _read_body(request, cfg.max_body_bytes)
            parsed = parse_search_request(body, kbs, default_k, cfg, roots)
            futures = [stats[kb].watch(batchers[kb].submit(q, k)) for kb, q, k in parsed]
        except RequestError as e:
            return reply(e.status, {"error": e.message})
        except QueueFull as e:
            return reply(503, {"error": str(e)})
        try:
            results: list = await wait_or_cancel(futures, request)
        except ClientGone:
            return reply(499, {"error": "client disconnected; its queries were dropped"})
        for i, (result, (kb, _, _)) in enumerate(zip(results, parsed, strict=True)):
            if isinstance(result, BaseException):  # only this request's own queries failed
                status, message = _failure(result, f"queries[{i}]", kb)
                return reply(status, {"error": message})
        request_ms.append((time.perf_counter() - t0) * 1000)
        return reply(200, {"results": [[h.to_dict() for h in hits] for hits in results]})

    @app.get("/kbs")
    async def list_kbs() -> JSONResponse:
        return JSONResponse({"kbs": [{"name": n, **info[n], "k": default_k[n]} for n in kbs]})

    @app.get("/health")
    async def health() -> JSONResponse:
        down = sorted(name for name, b in batchers.items() if not b.healthy)
        alive = not down
        payload = {
            "status": "ok" if alive else "degraded",
            "kbs": sorted(kbs),
            "batchers_down": down,
            "batcher_restarts": sum(b.restarts for b in batchers.values()),
            "uptime_s": round(time.time() - started, 1),
        }
        return JSONResponse(payload, status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics() -> JSONResponse:
        lat = np.asarray(request_ms, dtype=np.float64)
        return JSONResponse(
            {
                "requests": {str(code): n for code, n in sorted(status_counts.items())},
                "request_latency_ms_p50": round(float(np.percentile(lat, 50)), 3) if lat.size else None,
                "request_latency_ms_p99": round(float(np.percentile(lat, 99)), 3) if lat.size else None,
                "kbs": {name: s.snapshot() for name, s in stats.items()},
                "config": asdict(cfg),
            },
        )

    # the handler's own body check answers in this service's format; the guard's (twice as loose) is the backstop
    limits = RequestLimits(max_body_bytes=2 * cfg.max_body_bytes, max_concurrent=cfg.max_concurrent)
    guard = Guard(app, keys=api_keys, limits=limits)
    guard.state = app.state
    return guard


@contextlib.contextmanager
def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> Iterator[str]:
    """Run `app` under uvicorn in a background thread; yields its base URL and stops it on exit.

    Port 0 picks a free port. Meant for tests and benchmarks; production runs `main`.
    """
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"retrieval service did not start on {host}:{sock.getsockname()[1]}")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()


def main(argv: list[str] | None = None) -> int:
    """`kbrouter serve-retrieval`: load the KBs of a YAML file and serve them over HTTP until interrupted."""
    parser = argparse.ArgumentParser(prog="kbrouter serve-retrieval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", required=True, help="KB YAML file (knowledge_bases: [...]); indexes must be built")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="serve only these KBs (by name)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--build", action="store_true", help="build missing or stale indexes before serving")
    parser.add_argument("--record", metavar="JSONL", help="record every (query -> hits) answer to this snapshot")
    parser.add_argument("--replay", metavar="JSONL", help="serve answers from a snapshot instead of the indexes")
    for f in ("max_body_bytes", "max_queries", "max_k", "max_batch", "max_wait_ms"):
        default = ServiceConfig.__dataclass_fields__[f].default
        parser.add_argument("--" + f.replace("_", "-"), type=type(default), default=default)
    parser.add_argument(
        "--image-root", action="append", default=[], help="a folder query images may lie in (besides the KBs' media)"
    )
    parser.add_argument("--api-key", action="append", default=None, metavar="KEY",
                        help="accept `Authorization: Bearer KEY` (repeatable; also $KBROUTER_API_KEY)")  # fmt: skip
    parser.add_argument("--max-concurrent", type=int, default=ServiceConfig.max_concurrent)
    parser.add_argument("--log-level", default="info")
    add_drain_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")

    from retrievers.config import load_kb_configs, select_kbs
    from retrievers.kb import build_kb, load_kb
    from retrievers.replay import Recording, Replay
    from retrievers.security import kb_media_folders, resolve_api_keys, warn_if_exposed

    configs = load_kb_configs(args.kb)
    try:
        configs = select_kbs(configs, args.only, args.kb)
    except ValueError as e:
        parser.error(f"--only: {e}")
    kbs: dict[str, Retriever] = {}
    for c in configs:
        if args.replay:
            kbs[c.name] = Replay(args.replay, c.name)
            continue
        if args.build:
            build_kb(c)
        kbs[c.name] = load_kb(c)
        if args.record:
            kbs[c.name] = Recording(kbs[c.name], args.record, c.name)
    info = {
        c.name: {"display_name": c.display_name, "kind": c.kind, "granularity": c.granularity, "k": c.k}
        for c in configs
    }
    cfg = ServiceConfig(
        **{f: getattr(args, f) for f in ("max_body_bytes", "max_queries", "max_k", "max_batch", "max_wait_ms",
                                         "max_concurrent")}
    )  # fmt: skip
    keys = resolve_api_keys(args.api_key)
    roots = [*kb_media_folders(configs), *args.image_root]
    app = create_app(kbs, cfg, info, api_keys=keys, image_roots=roots)
    warn_if_exposed(args.host, keys, "kbrouter serve-retrieval")
    logger.info("retrieval service on http://%s:%d (KBs: %s)", args.host, args.port, ", ".join(kbs))
    return serve_until_signalled(
        app,
        args.host,
        args.port,
        drain_s=args.drain_s,
        log_level=args.log_level.lower(),
        name="kbrouter serve-retrieval",
    )


if __name__ == "__main__":
    raise SystemExit(main())
