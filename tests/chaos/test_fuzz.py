"""Both servers fuzzed on loopback (`benchmarks/fuzz_servers.py`, seeded): over 1,000 bad requests mixed with valid
ones and backend faults, sent concurrently so they share micro-batches. No bad input may cause a 5xx, every plainly
bad one (and each of the issue's probes) is a 4xx, every valid one answers what the policy or KB answers in-process,
nothing hangs, and both servers are healthy at the end."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("benchmarks/fuzz_servers.py")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from tests.chaos.fuzz import Images

    return Images(tmp_path_factory.mktemp("fuzz-images"))


REQUESTS = 800  # per server; about 2/3 bad: > 1,000 bad requests in all


def check(fig: dict) -> None:
    assert fig["bad_input_5xx"] == 0, fig["examples"]
    assert fig["reject_not_4xx"] == 0, fig["examples"]
    assert fig["valid_failed"] == 0 and fig["valid_differs"] == 0, fig["examples"]
    assert fig["faults_not_5xx"] == 0 and fig["hung"] == 0
    assert fig["health_at_end"] == "200 ok"


def test_fuzzing_the_policy_server(bench, images):
    fig = bench.fuzz_policy_server(REQUESTS, seed=0, concurrency=16, images=images)
    check(fig)
    assert fig["sent"] == REQUESTS and fig["bad_requests"] > 450
    assert fig["fault_requests"] > 0 and fig["by_status"].get(500, 0) == fig["fault_requests"]  # faults fail alone


def test_fuzzing_the_retrieval_service(bench, images):
    fig = bench.fuzz_retrieval_service(REQUESTS, seed=0, concurrency=16, images=images)
    check(fig)
    assert fig["sent"] == REQUESTS and fig["bad_requests"] > 450
