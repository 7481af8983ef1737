"""A `kbrouter serve` process over a fake policy, for tests that signal or kill a real server process.

    python tests/chaos/fake_server.py PORT_FILE --policy slow|stuck|cooperative [--drain-s S] [--exit-grace-s S]

The policy's replies are the last user text upper-cased, after `--delay` seconds: `slow` sleeps through the delay,
`cooperative` polls `abandoned_items()` and returns as soon as its items are abandoned (as the transformers
backends do), `stuck` ignores abandonment. The chosen port is written to PORT_FILE once the server listens;
`generating` is printed to stdout when a call reaches the policy, and `abandoned` when the cooperative policy saw
its items abandoned.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.backends.base import Completion  # noqa: E402
from agent.server import create_app  # noqa: E402
from retrievers.batching import abandoned_items  # noqa: E402
from retrievers.serving import serve_until_signalled  # noqa: E402


class DelayPolicy:
    name = "delay"

    def __init__(self, kind: str, delay: float) -> None:
        self.kind, self.delay = kind, delay

    def generate(self, conversations, params):  # noqa: ANN001, ANN201
        print("generating", flush=True)  # tests wait for this before they signal, instead of guessing a delay
        deadline = time.monotonic() + self.delay
        while time.monotonic() < deadline:
            if self.kind == "cooperative" and all(abandoned_items() or [False]):
                print("abandoned", flush=True)
                return [Completion(text="", finish_reason="abandoned") for _ in conversations]
            time.sleep(0.02)
        return [Completion(text=str(c[-1]["content"]).upper(), completion_tokens=1) for c in conversations]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("port_file")
    ap.add_argument("--policy", choices=["slow", "stuck", "cooperative"], default="slow")
    ap.add_argument("--delay", type=float, default=1.0)
    ap.add_argument("--drain-s", type=float, default=10.0)
    ap.add_argument("--exit-grace-s", type=float, default=5.0)
    args = ap.parse_args()
    with socket.socket() as s:  # a free port (the race with another process taking it is harmless in tests)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(DelayPolicy(args.policy, args.delay))

    import threading

    def announce() -> None:  # once the port accepts connections
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        Path(args.port_file).write_text(str(port))

    threading.Thread(target=announce, daemon=True).start()
    return serve_until_signalled(app, "127.0.0.1", port, drain_s=args.drain_s, exit_grace_s=args.exit_grace_s)


if __name__ == "__main__":
    raise SystemExit(main())
