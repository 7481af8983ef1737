"""The shared micro-batcher: one failing item fails alone, the loop cannot die for good, cancelled items are dropped."""

import asyncio

import pytest

from retrievers.batching import ClientGone, MicroBatcher, wait_or_cancel


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def upper(items, key):
    """A batched call that fails on the whole batch when any item is `poison`."""
    if "poison" in items:
        raise ValueError("poison is not a word")
    return [f"{x.upper()}{key}" for x in items]


def test_one_bad_item_fails_alone_and_the_rest_are_answered():
    calls = []

    async def main():
        b = MicroBatcher(lambda items, key: calls.append(len(items)) or upper(items, key), max_wait_s=0.05)
        b.start()
        futures = [b.submit(x, "!") for x in ("a", "poison", "b", "c")]
        results = await asyncio.gather(*futures, return_exceptions=True)
        await b.stop()
        return results

    a, poison, b, c = run(main())
    assert (a, b, c) == ("A!", "B!", "C!")
    assert isinstance(poison, ValueError) and "poison" in str(poison)
    assert calls[0] == 4 and calls[1:] == [1, 1, 1, 1]  # one batched try, then each item alone


def test_unhashable_key_is_refused_at_submit_not_in_the_loop():
    async def main():
        b = MicroBatcher(upper)
        b.start()
        with pytest.raises(TypeError, match="unhashable"):
            b.submit("a", ["not", "hashable"])
        answer = await b.submit("a", "?")
        healthy = b.healthy
        await b.stop()
        return answer, healthy

    assert run(main()) == ("A?", True)


def test_supervisor_restarts_a_dead_loop_and_health_says_so_meanwhile(monkeypatch):
    async def main():
        b = MicroBatcher(upper)
        real_gather = b._gather
        state = {"died": False}

        async def gather_once_broken():
            if not state["died"]:
                state["died"] = True
                raise RuntimeError("the loop itself broke")
            return await real_gather()

        monkeypatch.setattr(b, "_gather", gather_once_broken)
        b.start()
        await asyncio.sleep(0)  # the loop runs, dies
        await asyncio.sleep(0)
        down = b.healthy
        answer = await b.submit("x", "")  # queued while down, answered after the restart
        up = b.healthy
        await b.stop()
        return down, answer, up, b.restarts

    assert run(main()) == (False, "X", True, 1)


class FakeRequest:
    def __init__(self, gone_after: int) -> None:
        self.polls = 0
        self.gone_after = gone_after

    async def is_disconnected(self) -> bool:
        self.polls += 1
        return self.polls > self.gone_after


def test_disconnected_client_cancels_its_queued_items():
    seen = []

    def slow(items, key):
        import time

        seen.extend(items)
        time.sleep(0.3)
        return items

    async def main():
        b = MicroBatcher(slow, max_wait_s=0)
        b.start()
        first = b.submit("first", 0)
        await asyncio.sleep(0.05)  # "first" is being answered; "second" waits in the queue behind it
        second = b.submit("second", 0)
        with pytest.raises(ClientGone):
            await wait_or_cancel([second], FakeRequest(gone_after=0), poll_s=0.01)
        assert await first == "first"
        await asyncio.sleep(0.05)
        await b.stop()
        return second.cancelled()

    assert run(main()) is True
    assert seen == ["first"]  # the cancelled item never reached the model


def test_wait_or_cancel_returns_results_and_exceptions_in_order():
    async def main():
        b = MicroBatcher(upper, max_wait_s=0.02)
        b.start()
        out = await wait_or_cancel([b.submit("a", ""), b.submit("poison", "")], FakeRequest(gone_after=99))
        await b.stop()
        return out

    a, poison = run(main())
    assert a == "A" and isinstance(poison, ValueError)


def test_a_batcher_can_be_started_again_on_a_new_event_loop():
    b = MicroBatcher(upper)

    async def once():
        b.start()
        answer = await b.submit("a", "")
        await b.stop()
        return answer

    assert run(once()) == "A" and run(once()) == "A"  # e.g. one app served by two test clients in turn
