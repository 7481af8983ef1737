"""Running a server until SIGTERM or Ctrl-C, then draining it within a deadline (all three `kbrouter serve*`).

On the first SIGTERM/SIGINT uvicorn stops accepting connections and lets the requests in flight finish, for up to
`drain_s` seconds (`timeout_graceful_shutdown`, uvicorn's own graceful shutdown); then it cancels what is left,
which abandons those requests' batched work (`retrievers.batching.abandoned_items`: a generation stops at its next
token), and the app's lifespan stops its batchers. A worker thread that still does not end (a backend stuck in a
call that cannot be interrupted) cannot hold the process: `exit_grace_s` after the deadline it exits anyway, with
status 1, so a supervisor (systemd, Kubernetes) sees the stop complete in bounded time.
"""

from __future__ import annotations

import logging
import os
import threading
import time

logger = logging.getLogger(__name__)

DRAIN_S = 30.0
EXIT_GRACE_S = 5.0


def add_drain_args(ap) -> None:  # noqa: ANN001 (argparse.ArgumentParser)
    ap.add_argument(
        "--drain-s",
        type=float,
        default=DRAIN_S,
        help=f"on SIGTERM/Ctrl-C, seconds the requests in flight get to finish before they are cancelled "
        f"(default {DRAIN_S:g})",
    )


def serve_until_signalled(
    app,  # noqa: ANN001 (an ASGI app)
    host: str,
    port: int,
    *,
    drain_s: float = DRAIN_S,
    exit_grace_s: float = EXIT_GRACE_S,
    log_level: str = "warning",
    name: str = "kbrouter server",
) -> int:
    """Serve `app` until SIGTERM/SIGINT, drain within `drain_s`, and return 0 (or exit 1 if threads hang).

    Raises:
        ValueError: `drain_s` is negative.
    """
    import uvicorn

    if drain_s < 0:
        raise ValueError(f"--drain-s must be >= 0 seconds, got {drain_s}")

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:  # noqa: ANN001
            first = not self.should_exit
            super().handle_exit(sig, frame)
            if first:
                logger.warning("%s: stopping; requests in flight get up to %g s to finish", name, drain_s)
                threading.Thread(
                    target=_exit_if_still_running, args=(drain_s + exit_grace_s, name), daemon=True
                ).start()

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=False, timeout_graceful_shutdown=drain_s
    )
    DrainingServer(config).run()
    return 0


def _exit_if_still_running(after_s: float, name: str) -> None:
    time.sleep(after_s)
    logger.error("%s: still not stopped %g s after the signal (a worker is stuck); exiting now", name, after_s)
    logging.shutdown()
    os._exit(1)
