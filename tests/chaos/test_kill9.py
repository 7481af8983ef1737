"""kill -9 at seeded random moments in the long jobs, then finish: the output equals an uninterrupted run's, with no
record lost, duplicated or different (`tests/chaos/kill9.py`; figures over more kills: benchmarks/chaos_kill9.py).

Each job starts `kbrouter` processes several times (a clean run, the killed ones, the finishing one): a minute or
more each on idle cores, several on a busy machine, so all are in the `slow` tier (`-m slow`). `index` builds two real
BM25 indexes; `train` runs real LoRA SFT steps of SmolLM2, resumed with `--resume_from_checkpoint true`."""

from __future__ import annotations

import random

import pytest

from agent.server import create_app
from retrievers.service import serve_in_thread
from tests.chaos.kill9 import JOBS, chaos, grammar_blind_step_policy


@pytest.fixture(scope="module")
def policy_url():
    with serve_in_thread(create_app(grammar_blind_step_policy(0.15))) as url:
        yield url + "/v1"


@pytest.mark.parametrize(
    "job,kills",
    [
        pytest.param("run", 2, marks=pytest.mark.slow),
        pytest.param("eval", 2, marks=pytest.mark.slow),
        pytest.param("synth", 2, marks=pytest.mark.slow),
        pytest.param("index", 1, marks=pytest.mark.slow),
        pytest.param("train", 1, marks=pytest.mark.slow),
    ],
)
def test_kill9_then_finish_equals_an_uninterrupted_run(job, kills, policy_url, tmp_path):
    outcome = chaos(JOBS[job](policy_url), tmp_path, kills, random.Random(0))
    assert outcome.final_rc == 0, outcome.examples
    assert outcome.kills >= 1  # at least one kill landed while the job was working
    assert outcome.reference_records > 0
    assert (outcome.lost, outcome.duplicated, outcome.different) == (0, 0, 0), outcome.examples
