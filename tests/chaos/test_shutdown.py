"""SIGTERM drains a server within its deadline (`retrievers.serving`): requests in flight finish, new connections
are refused, work still running at the deadline is abandoned, and a stuck worker cannot keep the process alive.
Real server processes (`tests/chaos/fake_server.py`: `kbrouter serve` over a fake policy) signalled for real."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

SERVER = Path(__file__).with_name("fake_server.py")


def start(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), str(port_file), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(600):
        if port_file.exists() and port_file.read_text():
            return proc, f"http://127.0.0.1:{port_file.read_text()}"
        if proc.poll() is not None:
            raise AssertionError(f"server died: {proc.stderr.read()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("server did not start in 30 s")


def post_in_background(url: str, text: str, out: dict) -> threading.Thread:
    def go() -> None:
        try:
            r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": text}]},
                           timeout=60)  # fmt: skip
            out["status"], out["text"] = r.status_code, r.text
        except httpx.HTTPError as e:
            out["error"] = repr(e)

    t = threading.Thread(target=go)
    t.start()
    return t


def wait_in_flight(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Until the request has reached the policy (the server prints `generating`): a fixed sleep raced on a busy
    machine, where the signal could come before the request was in flight."""
    import selectors

    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())) and proc.stdout.readline().strip() == (
                "generating"
            ):
                return
            if proc.poll() is not None:
                break
    raise AssertionError(f"the request did not reach the policy in {timeout_s:g} s")


def test_sigterm_lets_the_request_in_flight_finish_and_refuses_new_ones(tmp_path):
    proc, url = start(tmp_path, "--policy", "slow", "--delay", "2", "--drain-s", "20")
    out: dict = {}
    t = post_in_background(url, "still answered", out)
    wait_in_flight(proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(httpx.ConnectError):  # the listening socket is closed at once
        httpx.get(url + "/health", timeout=5)
    t.join(60)
    rc = proc.wait(60)
    assert out.get("status") == 200 and "STILL ANSWERED" in out["text"], out
    assert rc == -signal.SIGTERM  # after draining, uvicorn ends the process by the signal it got, as is usual


def test_work_running_at_the_deadline_is_abandoned_and_the_process_exits_cleanly(tmp_path):
    proc, url = start(tmp_path, "--policy", "cooperative", "--delay", "60", "--drain-s", "0.5")
    out: dict = {}
    t = post_in_background(url, "too slow", out)
    wait_in_flight(proc)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(30)  # well before the policy's 60 s
    t.join(30)
    assert "abandoned" in proc.stdout.read()  # the policy was told its item has nobody waiting
    assert rc == -signal.SIGTERM
    assert out.get("status") != 200  # the client learns it got no answer (a closed connection or a 5xx)


@pytest.mark.parametrize(
    "sig,rc,says",
    [
        # uvicorn re-raises SIGTERM once drained: the default action ends the process, stuck thread or not
        (signal.SIGTERM, -signal.SIGTERM, ""),
        # Ctrl-C unwinds as KeyboardInterrupt, and the interpreter would join the stuck thread: the watchdog exits
        (signal.SIGINT, 1, "still not stopped"),
    ],
)
def test_a_stuck_worker_cannot_hold_the_process_past_deadline_plus_grace(tmp_path, sig, rc, says):
    # a grace of seconds, not one: on a busy machine uvicorn's own shutdown after the drain can take over a second
    proc, url = start(tmp_path, "--policy", "stuck", "--delay", "120", "--drain-s", "0.5", "--exit-grace-s", "8")
    out: dict = {}
    t = post_in_background(url, "never", out)
    wait_in_flight(proc)
    proc.send_signal(sig)
    assert proc.wait(60) == rc  # within a minute, not the policy's 120 s
    t.join(30)
    assert says in proc.stderr.read()
    assert out.get("status") != 200


def test_after_the_unhashable_probes_the_server_still_answers_and_sigterm_still_stops_it(tmp_path):
    # `seed: [1]` and `stop: [["x"]]` used to kill the batching task: later requests hung and SIGTERM did nothing
    proc, url = start(tmp_path, "--policy", "slow", "--delay", "0.1", "--drain-s", "5")
    try:
        chat = {"messages": [{"role": "user", "content": "after"}]}
        probes = [httpx.post(url + "/v1/chat/completions", json={**chat, **extra}, timeout=10)
                  for extra in ({"seed": [1]}, {"stop": [["x"]]})]  # fmt: skip
        after = httpx.post(url + "/v1/chat/completions", json=chat, timeout=10)
        health = httpx.get(url + "/health", timeout=10)
    finally:
        proc.send_signal(signal.SIGTERM)
    assert [r.status_code for r in probes] == [400, 400]
    assert after.status_code == 200 and "AFTER" in after.text
    assert health.json()["status"] == "ok"
    try:
        assert proc.wait(30) == -signal.SIGTERM
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("SIGTERM did not stop the server in 30 s") from None
