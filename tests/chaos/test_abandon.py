"""Work nobody waits for stops: a client that disconnects from `kbrouter serve` abandons its running generation
(`retrievers.batching.abandoned_items`), and the real SmolLM2 backend stops exactly the abandoned rows of a batch
while the other rows generate on, unchanged."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from agent.backends.base import Completion, SamplingParams
from agent.server import create_app
from retrievers.batching import MicroBatcher, abandoned_items
from retrievers.service import serve_in_thread


class WaitsUntilAbandoned:
    """Generates "forever" (60 s) unless its items are abandoned; records what it saw."""

    name = "patient"

    def __init__(self) -> None:
        self.saw_abandoned = threading.Event()
        self.started = threading.Event()

    def generate(self, conversations, params):  # noqa: ANN001, ANN201
        self.started.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(abandoned_items() or [False]):
                self.saw_abandoned.set()
                return [Completion(text="", finish_reason="abandoned") for _ in conversations]
            time.sleep(0.02)
        return [Completion(text="late") for _ in conversations]


def test_a_client_that_disconnects_abandons_its_running_generation():
    policy = WaitsUntilAbandoned()
    with serve_in_thread(create_app(policy)) as url:
        body = {"messages": [{"role": "user", "content": "write a long story"}], "max_tokens": 4000}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + "/v1/chat/completions", json=body, timeout=1.0)  # the client gives up
        assert policy.started.is_set()
        assert policy.saw_abandoned.wait(10)  # the generation learned it could stop (it would run 60 s)
        after = httpx.get(url + "/health", timeout=10)
    assert after.status_code == 200


def test_abandoned_items_is_none_outside_a_batcher_call():
    assert abandoned_items() is None


@pytest.fixture(scope="module")
def smollm2_policy(smollm2_dir):
    from agent.backends.hf import TransformersPolicy

    return TransformersPolicy(smollm2_dir)


CONVS = [
    [{"role": "user", "content": "Count from 1 to 200, separated by commas."}],
    [{"role": "user", "content": "Name three colours."}],
]
PARAMS = SamplingParams(max_new_tokens=40)


def test_smollm2_stops_only_the_abandoned_row_of_a_batch(smollm2_policy):
    direct = smollm2_policy.generate(CONVS, PARAMS)  # the same batch, outside any batcher: nothing abandoned

    async def main() -> list:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future] = []

        def abandon_first_then_generate(convs, params):  # noqa: ANN001, ANN202
            # inside the call, as when a client leaves mid-generation: the first item's future is cancelled
            done = threading.Event()
            loop.call_soon_threadsafe(lambda: (futures[0].cancel(), done.set()))
            done.wait(10)
            return smollm2_policy.generate(convs, params)

        batcher = MicroBatcher(abandon_first_then_generate, max_wait_s=0.2)
        batcher.start()
        outs: list = []
        real_call = batcher._call_in_thread

        def keep_outputs(items, key):  # noqa: ANN001, ANN202
            result = real_call(items, key)
            outs.extend(result)
            return result

        batcher._call_in_thread = keep_outputs
        futures.extend(batcher.submit(c, PARAMS) for c in CONVS)
        second = await futures[1]
        await batcher.stop()
        return [outs, second]

    (abandoned, kept), second = asyncio.run(asyncio.wait_for(main(), 300))
    assert abandoned.finish_reason == "abandoned"
    assert abandoned.completion_tokens <= 1 < direct[0].completion_tokens  # stopped at its first token, not 40
    assert kept == second and kept.text == direct[1].text  # the other row is untouched
