"""The whole step loop with the tiny random Qwen2.5-VL on a real COCO image question over image + clip KBs.

Two runs: (1) the model as it is: random weights rarely write valid tags, so the check is that every step prompt
carried the question image to the model by path and the trajectory records it; (2) the same model with its plan
*text* replaced by a fixed route (image KB, then clip KB, then stop): every call still runs the real model on the
real pixels, and the trajectory must hold media hits from both KBs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.backends.base import Completion, SamplingParams
from agent.kbs import knowledge_bases
from agent.loop import AgentConfig, StepAgent
from agent.protocol import PLAN_SYSTEM
from agent.types import Question, Trajectory

from .conftest import DEMO, TINY_CLIP

CAT = DEMO / "images" / "000000358083.jpg"  # COCO 358083: "A cat next to a reflection of itself in a mirror."
CONFIG = AgentConfig(max_steps=3, max_retries=0, plan_tokens=8, answer_tokens=8, final_tokens=8, few_shot=False)


@pytest.fixture(scope="module")
def media_kbs(tmp_path_factory):
    from retrievers.config import KBConfig

    root = tmp_path_factory.mktemp("index")
    configs = [
        KBConfig(
            name="image",
            display_name="Image Retriever",
            kind="image",
            corpus=DEMO / "images" / "images.jsonl",
            search="dense",
            index_dir=root / "image",
            k=2,
            options={**TINY_CLIP, "visual_weight": 0.2},
        ),
        KBConfig(
            name="clip",
            display_name="Clip Retriever",
            kind="clip",
            corpus=DEMO / "videos",
            search="dense",
            index_dir=root / "clip",
            k=2,
            options={**TINY_CLIP, "visual_weight": 0.2, "frames_per_clip": 2, "skip_nonref": True},
        ),
    ]
    return knowledge_bases(configs)


class Recording:
    """Wraps a policy; records every conversation and completion; optionally rewrites plan-step text."""

    def __init__(self, inner, plans: list[str] | None = None):
        self.inner = inner
        self.name = inner.name
        self.plans = plans
        self.calls: list[tuple[list[dict], Completion]] = []

    def generate(self, conversations, params: SamplingParams):
        out = self.inner.generate(conversations, params)
        if self.plans is not None:
            out = [self._route(c, o) for c, o in zip(conversations, out, strict=True)]
        self.calls += list(zip(conversations, out, strict=True))
        return out

    def _route(self, conv, completion: Completion) -> Completion:
        if not conv[0]["content"].startswith(PLAN_SYSTEM.split("\n")[0]):
            return completion
        text = conv[-1]["content"][-1]["text"]
        step = text.count("Sub-question ")  # answered sub-questions so far
        return Completion(
            self.plans[step], completion.prompt_tokens, completion.completion_tokens, "stop", completion.metadata
        )


def images_sent(conv) -> list[str]:
    return [p["image"] for m in conv if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image"]


def check_round_trip(traj: Trajectory) -> None:
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert again == traj


def test_loop_with_the_real_tiny_vlm(tiny_vl_policy, media_kbs):
    policy = Recording(tiny_vl_policy)
    question = Question("coco-358083", "What animal is looking into the mirror?", images=(str(CAT),), answers=("cat",))
    traj = StepAgent(policy, media_kbs, CONFIG).run_batch([question])[0]
    assert traj.images == (str(CAT),)
    # 8 plan tokens cannot hold a whole plan (the tags alone are longer), so whatever the random weights write, the
    # first plan is malformed and, with no retries, ends the search; the final step still answers
    assert traj.stop_reason == "format_error"
    assert len(traj.steps) == 1 and traj.steps[0].sub_question is None and traj.steps[0].format_errors
    assert traj.final_raw  # the final step ran and its raw output is kept
    assert len(policy.calls) == 2  # one plan, then the final step
    for conv, completion in policy.calls:
        assert images_sent(conv) == [str(CAT)]  # the question image, by path, in every step
        assert completion.metadata["images"] == 1  # ...and its pixels reached the model
        assert completion.finish_reason != "error"
    check_round_trip(traj)


def test_loop_routes_to_image_and_clip_kbs(tiny_vl_policy, media_kbs):
    plans = [
        "<think>I should look at similar photos.</think><sub-question>a cat next to a mirror</sub-question>"
        "<ret>Image Retriever</ret>",
        "<think>Is there a clip with animals?</think><sub-question>Sinbad and his lions</sub-question>"
        "<ret>clip retriever</ret>",  # display names match case-insensitively
        "<think>Enough.</think><sub-question>None</sub-question><ret>None</ret>",
    ]
    policy = Recording(tiny_vl_policy, plans)
    question = Question("coco-358083", "What animal is looking into the mirror?", images=(str(CAT),), answers=("cat",))
    traj = StepAgent(policy, media_kbs, CONFIG).run_batch([question])[0]
    assert [s.kb for s in traj.steps[:2]] == ["image", "clip"]
    image_hits, clip_hits = traj.steps[0].hits, traj.steps[1].hits
    assert image_hits[0].doc.id == "coco-358083"  # the caption signal finds the photo itself
    assert all(h.doc.modality == "image" and Path(h.doc.media.path).is_file() for h in image_hits)
    assert all(h.doc.modality == "video" and h.doc.media.end > h.doc.media.start for h in clip_hits)
    assert any("whale" in h.doc.text or "lion" in h.doc.text.lower() or "Sinbad" in h.doc.text for h in clip_hits)
    assert traj.steps[2].sub_question is None  # the third plan stopped
    # the answer steps saw the sub-question, the evidence text and the question image
    answer_calls = [(c, o) for c, o in policy.calls if c[0]["content"].startswith("You answer a question using")]
    assert len(answer_calls) == 2
    for conv, completion in answer_calls:
        assert images_sent(conv) == [str(CAT)] and completion.metadata["images"] == 1
    assert "Clip Retriever" not in answer_calls[1][0][-1]["content"][-1]["text"]  # evidence is tagged by KB name
    assert "clip-0:" in answer_calls[1][0][-1]["content"][-1]["text"]
    check_round_trip(traj)
