"""What the three servers (`kbrouter serve`, `kbrouter serve-retrieval`, `kbrouter serve-agent`) share to be safe
to expose: API keys, the bind warning, request limits, uploaded images and media containment.

- **API keys** (`--api-key`, several allowed, or `$KBROUTER_API_KEY`, comma-separated), checked as
  `Authorization: Bearer KEY` on every route, as vLLM does; a missing or wrong key is a 401.
- **Binding**: the default host is 127.0.0.1; another host without a key logs a warning (`warn_if_exposed`).
- **Limits** (`RequestLimits`): body bytes (413) and concurrent requests (429), enforced before a handler runs;
  the handlers add their own per-field limits (message count, max tokens, n, image bytes and pixels).
- **Images from clients** arrive as data URLs and are written to a server-owned folder (`ImageUploads`) after the
  byte, pixel and format checks. A path, a `file://` URL or any other local reference is refused unless it lies
  inside a folder the server was configured with; a remote `http(s)://` URL is fetched only when allowed.
- **Media** (`MediaRoots`) is served only from the configured KBs' media folders, by links the server signed
  itself: `..`, absolute paths, symlinks that leave the folder and unsigned paths get 403/404 and no content.

This module lives in `retrievers` because `kbrouter serve-retrieval` needs it and `retrievers` imports nothing of
ours; `agent` imports it from here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote

from retrievers.media import ImageTooLarge, MediaError, check_image_pixels

logger = logging.getLogger(__name__)

API_KEY_ENV = "KBROUTER_API_KEY"

# ASGI callables, typed loosely on purpose: Starlette's own types are not imported by `retrievers`
ASGIApp = Callable[[dict, Callable, Callable], Awaitable[None]]


def resolve_api_keys(flag_keys: Iterable[str] | None = None, env: dict | None = None) -> tuple[str, ...]:
    """The accepted keys: every `--api-key` value and `$KBROUTER_API_KEY`, each possibly comma-separated."""
    env = os.environ if env is None else env
    raw = [*(flag_keys or ()), env.get(API_KEY_ENV, "")]
    keys = tuple(dict.fromkeys(k.strip() for item in raw for k in item.split(",") if k.strip()))
    short = [k for k in keys if len(k) < 8]
    if short:
        raise ValueError(f"API keys must have at least 8 characters; {len(short)} given are shorter")
    return keys


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps the server on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(host: str, keys: Sequence[str], server: str) -> str | None:
    """Log (and return) a warning when `server` binds beyond loopback with no API key."""
    if is_loopback(host) or keys:
        return None
    message = (
        f"{server} binds to {host}, reachable from other machines, with no API key: anyone who can reach it can "
        f"use it. Pass --api-key KEY (or set ${API_KEY_ENV}), or bind to 127.0.0.1"
    )
    logger.warning(message)
    return message


def add_security_args(parser, max_body_bytes: int, max_concurrent: int) -> None:  # noqa: ANN001 (argparse parser)
    """The flags every server takes: --api-key (repeatable), --max-body-bytes, --max-concurrent."""
    parser.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help=f"accept `Authorization: Bearer KEY` (repeatable; also ${API_KEY_ENV}, comma-separated); "
        "without any key the server is open to whoever can reach it",
    )
    parser.add_argument("--max-body-bytes", type=int, default=max_body_bytes, help="largest request body (413)")
    parser.add_argument("--max-concurrent", type=int, default=max_concurrent, help="requests at once (429 above)")


async def _send_json(send: Callable, status: int, payload: dict, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def error_payload(message: str, kind: str, code: str | None = None) -> dict:
    """An OpenAI-style error body (`{"error": {...}}`), which the `openai` client turns into a readable exception;
    `detail` repeats the message for clients that read FastAPI's usual field."""
    return {"error": {"message": message, "type": kind, "code": code}, "detail": message}


def bearer_ok(headers: Iterable[tuple[bytes, bytes]], keys: Sequence[str]) -> bool:
    """Whether the `Authorization: Bearer ...` header holds one of `keys` (compared in constant time)."""
    value = next((v.decode("latin-1") for k, v in headers if k.lower() == b"authorization"), "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    token_b = token.strip().encode()
    return any(hmac.compare_digest(token_b, k.encode()) for k in keys)


@dataclass
class RequestLimits:
    """Bounds enforced before any handler runs (pure ASGI, so they hold for streamed responses too).

    Args:
        max_body_bytes: largest request body; more is a 413.
        max_concurrent: requests handled at once (a streamed response counts until it ends); more is a 429.
    """

    max_body_bytes: int = 1 << 20
    max_concurrent: int = 64

    def __post_init__(self) -> None:
        for key in ("max_body_bytes", "max_concurrent"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(f"RequestLimits `{key}` must be a positive integer, got {getattr(self, key)!r}")


class Guard:
    """ASGI middleware: API key (401), body size (413) and concurrency (429) checks, in that order.

    Args:
        app: the wrapped ASGI app.
        keys: accepted API keys; empty means no key is needed.
        limits: body and concurrency bounds.
        public: paths served without a key (e.g. a static page that holds no data).
        authorized: optional extra check `(scope) -> bool` that admits a request without a key (signed media links).
    """

    def __init__(
        self,
        app: ASGIApp,
        keys: Sequence[str] = (),
        limits: RequestLimits | None = None,
        public: Iterable[str] = (),
        authorized: Callable[[dict], bool] | None = None,
    ) -> None:
        self.app = app
        self.keys = tuple(keys)
        self.limits = limits or RequestLimits()
        self.public = frozenset(public)
        self.authorized = authorized
        self.in_flight = 0

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.keys and scope["path"] not in self.public and not (self.authorized and self.authorized(scope)):
            if not bearer_ok(scope.get("headers", []), self.keys):
                payload = error_payload(
                    "missing or wrong API key: send `Authorization: Bearer KEY`",
                    "authentication_error",
                    "invalid_api_key",
                )
                await _send_json(send, 401, payload, [(b"www-authenticate", b"Bearer")])
                return
        if self.in_flight >= self.limits.max_concurrent:
            message = f"the server is handling {self.in_flight} requests, its limit; retry shortly"
            await _send_json(send, 429, error_payload(message, "rate_limit_error", "too_many_requests"))
            return
        self.in_flight += 1
        try:
            receive = await self._bounded_body(scope, receive, send)
            if receive is not None:
                await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _bounded_body(self, scope: dict, receive: Callable, send: Callable) -> Callable | None:
        """Read the body up to the limit and replay it to the app; None when a 413 was sent instead."""
        limit = self.limits.max_body_bytes
        declared = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        too_big = f"request body is over this server's limit of {limit} bytes"
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _send_json(send, 413, error_payload(too_big, "invalid_request_error", "body_too_large"))
            return None
        if scope.get("method") in ("GET", "HEAD"):
            return receive
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _send_json(send, 413, error_payload(too_big, "invalid_request_error", "body_too_large"))
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls: the disconnect, when it comes

        return replay


# -- images sent by clients -------------------------------------------------------------------------------------

IMAGE_MIMES = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif", "image/webp": ".webp"}


@dataclass
class ImageLimits:
    """Bounds on one image a client sends."""

    max_bytes: int = field(default=8 << 20, metadata={"help": "largest decoded image file (bytes)"})
    max_pixels: int = field(default=16_000_000, metadata={"help": "largest width * height"})
    max_images: int = field(default=4, metadata={"help": "images in one request"})


class ImageUploads:
    """Client images, checked and written to a server-owned folder; returns paths the policy and KBs may read.

    Args:
        folder: where uploads go (default: a fresh temporary folder, removed by `close`).
        limits: byte, pixel and count bounds.
        allowed_roots: folders whose files a request may name by path (default: none, so only data URLs work).
        allow_remote: fetch `http(s)://` image URLs (off by default: a server that fetches what clients name can
            be made to probe its own network).
    """

    def __init__(
        self,
        folder: str | os.PathLike | None = None,
        limits: ImageLimits | None = None,
        allowed_roots: Iterable[str | os.PathLike] = (),
        allow_remote: bool = False,
    ) -> None:
        self._tmp = None if folder is not None else tempfile.TemporaryDirectory(prefix="kbrouter-uploads-")
        self.folder = Path(folder if folder is not None else self._tmp.name)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.limits = limits or ImageLimits()
        self.allowed_roots = [Path(r).resolve() for r in allowed_roots]
        self.allow_remote = allow_remote

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    def save(self, url: str) -> Path:
        """A local, checked image file for an `image_url` value.

        Raises:
            ValueError: the reference is refused, too large, or not an image; the message says which and why.
        """
        url = url.strip()
        if url.startswith("data:"):
            return self._store(*decode_data_url(url, self.limits.max_bytes))
        if url.lower().startswith(("http://", "https://")):
            if not self.allow_remote:
                raise ValueError(
                    "image URLs are not fetched by this server (start it with --allow-remote-images to allow it); "
                    "send the image inline as a data URL (data:image/png;base64,...)"
                )
            return self._store(*self._fetch(url))
        path = Path(unquote(url[len("file://") :]) if url.lower().startswith("file://") else url)
        inside = inside_roots(path, self.allowed_roots) if self.allowed_roots else None
        if inside is None:
            raise ValueError(
                "images must be sent inline as data URLs (data:image/png;base64,...); this server reads no local "
                "file a request names" + (" outside its image folders" if self.allowed_roots else "")
            )
        self._check(inside)
        return inside

    def _fetch(self, url: str) -> tuple[bytes, str]:
        import httpx

        limit = self.limits.max_bytes
        with httpx.stream("GET", url, timeout=10, follow_redirects=False) as r:
            if r.status_code != 200:
                raise ValueError(f"fetching the image failed: HTTP {r.status_code}")
            mime = r.headers.get("content-type", "").split(";")[0].strip().lower()
            data = b""
            for chunk in r.iter_bytes():
                data += chunk
                if len(data) > limit:
                    raise ValueError(f"the image at the URL is over {limit} bytes")
        return data, mime

    def _store(self, data: bytes, mime: str) -> Path:
        if mime not in IMAGE_MIMES:
            raise ValueError(f"an image must be one of {sorted(IMAGE_MIMES)}; got {mime or 'no type'!r}")
        digest = hashlib.sha256(data).hexdigest()[:24]
        path = self.folder / f"{digest}{IMAGE_MIMES[mime]}"
        if not path.exists():
            tmp = path.with_suffix(".part")
            tmp.write_bytes(data)
            try:
                self._check(tmp)
            except ValueError:
                tmp.unlink(missing_ok=True)
                raise
            tmp.replace(path)
        return path

    def _check(self, path: Path) -> None:
        size = path.stat().st_size
        if size > self.limits.max_bytes:
            raise ValueError(f"the image is {size} bytes; at most {self.limits.max_bytes} are accepted")
        try:
            check_image_pixels(path, self.limits.max_pixels)
        except ImageTooLarge as e:
            raise ValueError(str(e).replace(str(path), "the image")) from None
        except (MediaError, FileNotFoundError):
            raise ValueError("the upload is not a readable image (PNG, JPEG, GIF or WebP)") from None


def decode_data_url(url: str, max_bytes: int) -> tuple[bytes, str]:
    """`(bytes, mime type)` of a base64 `data:` URL, refusing one that decodes to more than `max_bytes`."""
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise ValueError("a data URL must look like data:image/png;base64,<base64 bytes>")
    if len(payload) * 3 // 4 > max_bytes + 3:
        raise ValueError(f"the image is over {max_bytes} bytes; send a smaller one")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the data URL's payload is not valid base64") from None
    if len(data) > max_bytes:
        raise ValueError(f"the image is {len(data)} bytes; at most {max_bytes} are accepted")
    return data, head[len("data:") : -len(";base64")].strip().lower()


# -- media served from the KBs' folders ---------------------------------------------------------------------------


def inside_roots(path: Path, roots: Sequence[Path]) -> Path | None:
    """The real path of `path` if it exists and lies inside one of `roots` (symlinks resolved), else None."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return real if real.is_file() and any(real.is_relative_to(r) for r in roots) else None


class MediaRoots:
    """The media folders a server may serve from, and the signed links it hands out for files inside them.

    A link is `/media/{root}/{relative path}?sig=...`; the signature (HMAC with a per-process secret) means only files
    the server itself linked (from a hit) can be fetched, with or without an API key, so `<img>` and `<video>` tags
    work in a page that holds a key only in script.
    """

    def __init__(self, roots: Iterable[str | os.PathLike], secret: bytes | None = None) -> None:
        self.roots = [Path(r).resolve() for r in roots]
        self.secret = secret or secrets.token_bytes(32)

    def sign(self, index: int, rel: str) -> str:
        return hmac.new(self.secret, f"{index}/{rel}".encode(), hashlib.sha256).hexdigest()[:32]

    def link(self, path: str | os.PathLike) -> str | None:
        """The signed URL path of a media file, or None when it is not inside a media folder."""
        real = inside_roots(Path(path), self.roots)
        if real is None:
            return None
        for i, root in enumerate(self.roots):
            if real.is_relative_to(root):
                rel = real.relative_to(root).as_posix()
                return f"/media/{i}/{quote(rel)}?sig={self.sign(i, rel)}"
        return None  # pragma: no cover - `_inside` said it is under a root

    def signed(self, scope: dict) -> bool:
        """Whether a request's path and `sig` query match (lets `Guard` admit media links without a key)."""
        parsed = self.parse(scope.get("path", ""), scope.get("query_string", b"").decode("latin-1"))
        return parsed is not None and hmac.compare_digest(parsed[2], self.sign(parsed[0], parsed[1]))

    @staticmethod
    def parse(path: str, query: str) -> tuple[int, str, str] | None:
        if not path.startswith("/media/"):
            return None
        index, _, rel = path[len("/media/") :].partition("/")
        sig = next((v for k, _, v in (p.partition("=") for p in query.split("&")) if k == "sig"), "")
        return (int(index), rel, sig) if index.isdigit() else None

    def resolve(self, index: int, rel: str, sig: str) -> Path:
        """The file behind a media link.

        Raises:
            PermissionError: a wrong signature, `..`, an absolute path, or a file (symlink) outside the folder.
            FileNotFoundError: no such root or file.
        """
        if not hmac.compare_digest(sig, self.sign(index, rel)):
            raise PermissionError("this media link is not one the server handed out")
        if index >= len(self.roots):
            raise FileNotFoundError("no such media folder")
        parts = rel.split("/")
        if rel.startswith("/") or "\\" in rel or "\x00" in rel or any(p in ("..", "") for p in parts):
            raise PermissionError("media paths are relative to a KB's media folder, without `..`")
        root = self.roots[index]
        real = inside_roots(root / rel, [root])
        if real is None:
            if (root / rel).exists():
                raise PermissionError("that file is outside the KB's media folder")
            raise FileNotFoundError("no such media file")
        return real


def kb_media_folders(configs: Iterable) -> list[Path]:
    """The media folders of KB configs: the corpus folder (or the corpus file's folder) of image, clip and video KBs."""
    out = []
    for c in configs:
        if c.kind in ("image", "clip", "video"):
            corpus = Path(c.corpus)
            out.append(corpus if corpus.is_dir() else corpus.parent)
    return list(dict.fromkeys(out))
