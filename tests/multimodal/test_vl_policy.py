"""The vision-language policy with a tiny random Qwen2.5-VL: images by path, the pixel budget, errors per item,
evidence images, and data URLs for OpenAI-compatible servers."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest

from agent.backends.base import SamplingParams
from agent.backends.images import image_to_data_url
from agent.protocol import add_evidence_images, evidence_image_paths
from retrievers.types import Doc, Hit, Media

from .conftest import DEMO

IMAGES = sorted((DEMO / "images").glob("*.jpg"))
PARAMS = SamplingParams(max_new_tokens=4)


def user(*images, text="What is shown?"):
    return [
        {"role": "system", "content": "Answer briefly."},
        {
            "role": "user",
            "content": [*({"type": "image", "image": str(p)} for p in images), {"type": "text", "text": text}],
        },
    ]


def test_tiny_model_loads_as_a_policy(tiny_vl_policy, tiny_vl_dir):
    assert tiny_vl_policy.name == Path(tiny_vl_dir).name and tiny_vl_policy.max_images == 2  # the fixture's settings
    assert tiny_vl_policy.tokenizer.padding_side == "left"


def test_batch_with_images_budget_and_errors(tiny_vl_policy, tmp_path):
    conversations = [
        user(IMAGES[0]),  # one image
        [{"role": "user", "content": "no image at all, plain text"}],  # text-only turn in the same batch
        user(IMAGES[1], IMAGES[2], IMAGES[3]),  # three images, budget is 2: the last one is dropped
        user(tmp_path / "missing.jpg"),  # unreadable image: this item fails, the others do not
    ]
    out = tiny_vl_policy.generate(conversations, PARAMS)
    assert len(out) == 4
    assert [c.metadata.get("images") for c in out[:3]] == [1, 0, 2]
    assert out[2].metadata["images_dropped"] == 1
    for c in out[:3]:  # "length" exactly when the 4-token budget ran out, else the model stopped by itself
        assert 0 < c.completion_tokens <= 4 and c.finish_reason == ("length" if c.completion_tokens == 4 else "stop")
    assert out[3].finish_reason == "error" and "missing.jpg" in out[3].metadata["error"]
    # an image costs visual tokens in the prompt: more images, longer prompt
    assert out[2].prompt_tokens > out[0].prompt_tokens > 0


def test_pixel_budget_bounds_visual_tokens(tiny_vl_dir):
    from agent.backends.hf_vl import VisionLanguagePolicy

    small = VisionLanguagePolicy(tiny_vl_dir, min_pixels=28 * 28, max_pixels=28 * 28 * 4)
    text, paths, dropped = small.render(user(IMAGES[0]))
    assert paths == [str(IMAGES[0])] and dropped == 0
    enc = small.processor(text=[text], images=[small._load(paths[0])], return_tensors="pt")
    image_tokens = int((enc["input_ids"] == small.model.config.image_token_id).sum())
    assert 1 <= image_tokens <= 4  # 28x28 pixels per token after the 2x2 merge, at most 4 tokens' worth
    with pytest.raises(ValueError, match="min_pixels"):
        VisionLanguagePolicy(tiny_vl_dir, min_pixels=100, max_pixels=10)


def test_same_seed_same_sample(tiny_vl_policy):
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    a = tiny_vl_policy.generate([user(IMAGES[0])], params)[0].text
    b = tiny_vl_policy.generate([user(IMAGES[0])], params)[0].text
    assert a == b


def test_evidence_images(tmp_path, shared_data):
    video = shared_data / "video" / "videos" / "pyscenedetect_testvideo.mp4"
    hits = [
        Hit(Doc("a", "caption", modality="image", media=Media(str(IMAGES[4]))), 0.9, 0, "image"),
        Hit(Doc("b", "no pixels"), 0.8, 1, "text"),  # a text hit adds nothing
        Hit(Doc("c", "clip", modality="video", media=Media(str(video), 2.0, 4.0)), 0.7, 2, "clip"),
        Hit(Doc("d", "over budget", modality="image", media=Media(str(IMAGES[5]))), 0.6, 3, "image"),
    ]
    paths = evidence_image_paths(hits, max_images=2, frame_dir=tmp_path)
    assert paths[0] == str(IMAGES[4])
    assert paths[1].startswith(str(tmp_path)) and paths[1].endswith(".jpg")  # the clip's middle frame, cached
    messages = add_evidence_images(user(IMAGES[0]), hits[:1], max_images=2)
    parts = messages[-1]["content"]
    assert [p["image"] for p in parts if p["type"] == "image"] == [str(IMAGES[0]), str(IMAGES[4])]  # question first
    assert parts[-1]["type"] == "text"


def test_image_to_data_url(tmp_path):
    from PIL import Image

    url = image_to_data_url(IMAGES[0], max_pixels=64 * 64)
    assert url.startswith("data:image/jpeg;base64,")
    image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert image.size[0] * image.size[1] <= 64 * 64
    assert image_to_data_url(IMAGES[0], fmt="png").startswith("data:image/png;base64,")
    (tmp_path / "bad.jpg").write_text("not an image")
    with pytest.raises(ValueError, match="bad.jpg"):
        image_to_data_url(tmp_path / "bad.jpg")


def test_is_vision_language_model(tiny_vl_dir, smollm2_dir, tmp_path):
    from agent.backends.hf_vl import is_vision_language_model

    assert is_vision_language_model(tiny_vl_dir)  # Qwen2.5-VL config has a vision_config
    assert not is_vision_language_model(smollm2_dir)  # a text-only causal LM
    assert not is_vision_language_model(tmp_path)  # no config.json at all


def test_continuation_scores_equal_one_full_forward_and_read_the_image(tiny_vl_policy):
    """The route prior's scores on the vl backend: each KB name's summed log-prob after the plan so far, as one
    forward pass over prompt + name computes it, and they depend on the question's image."""
    import math

    import torch

    prefix = "<think>look it up</think>\n<sub-question>What is shown?</sub-question>\n<ret>"
    options = ["Image Retriever</ret>", "Text Retriever</ret>", "None</ret>"]
    policy = tiny_vl_policy
    conv = user(IMAGES[0])
    (scores,) = policy.continuation_logprobs([conv], [prefix], options, step="plan")
    text, paths, _ = policy.render(conv)
    images = [policy._load(p) for p in paths]
    for option, score in zip(options, scores, strict=True):
        enc = policy.processor(text=[text + prefix], images=images, return_tensors="pt", add_special_tokens=False)
        tail = policy.tokenizer(option, add_special_tokens=False)["input_ids"]
        n = enc["input_ids"].shape[1]
        enc["input_ids"] = torch.cat([enc["input_ids"], torch.tensor([tail])], 1)
        enc["attention_mask"] = torch.ones_like(enc["input_ids"])
        types = enc["mm_token_type_ids"]
        enc["mm_token_type_ids"] = torch.cat([types, torch.zeros((1, len(tail)), dtype=types.dtype)], 1)
        policy.model.model.rope_deltas = None
        with torch.inference_mode():
            logp = policy.model(**enc).logits[0].float().log_softmax(-1)
        policy.model.model.rope_deltas = None
        expected = sum(float(logp[n - 1 + j, t]) for j, t in enumerate(tail))
        assert math.isclose(score, expected, abs_tol=1e-3), option
    (other,) = policy.continuation_logprobs([user(IMAGES[1])], [prefix], options)
    assert other != scores  # another picture, other scores: the pixels are read
    (again,) = policy.continuation_logprobs([conv], [prefix], options)
    assert again == pytest.approx(scores, abs=1e-4)  # nothing carried over between calls (rope offsets)


def test_auto_route_prior_is_on_for_the_vl_backend(tiny_vl_policy):
    from agent.loop import AgentConfig, make_route_prior
    from agent.routing import AUTO_WEIGHT

    prior = make_route_prior(AgentConfig(route_prior=None), tiny_vl_policy, {})
    assert prior is not None and prior.weight == AUTO_WEIGHT


def test_prompt_scores_of_an_open_reply_add_up_to_the_continuation_scores(tiny_vl_policy):
    """What `kbrouter serve --backend vl` answers a scoring request with: the open reply's last tokens score what
    `continuation_logprobs` gives for them (the same model, images and positions)."""
    prefix = "<think>look</think>\n<sub-question>What is shown?</sub-question>\n<ret>"
    option = "Image Retriever</ret>"
    conv = user(IMAGES[0])
    ((ids, logprobs),) = tiny_vl_policy.prompt_logprobs([[*conv, {"role": "assistant", "content": prefix + option}]])
    assert logprobs[0] is None and len(ids) == len(logprobs)
    n = len(tiny_vl_policy.tokenizer(option, add_special_tokens=False)["input_ids"])
    assert tiny_vl_policy.tokenizer.decode(ids[-n:]) == option
    ((expected,),) = tiny_vl_policy.continuation_logprobs([conv], [prefix], [option])
    assert sum(logprobs[-n:]) == pytest.approx(expected, abs=1e-3)
    with pytest.raises(ValueError, match="must be an assistant message"):
        tiny_vl_policy.prompt_logprobs([conv])


def test_grouped_prompt_scores_equal_one_conversation_at_a_time(tiny_vl_policy):
    """A served route prior sends one scoring request per KB name: those sharing images run as one padded forward,
    and every row scores as it does alone (mixed images, reply lengths and a conversation without images)."""
    prefix = "<think>look</think>\n<sub-question>What is shown?</sub-question>\n<ret>"
    options = ["Image Retriever</ret>", "Text Retriever</ret>", "Clip Retriever over a long name</ret>", ""]
    convs = [
        [*user(image), {"role": "assistant", "content": prefix + option}]
        for image in (IMAGES[0], IMAGES[1])
        for option in options
    ]
    convs.append([{"role": "user", "content": "No image here."}, {"role": "assistant", "content": prefix}])
    grouped = tiny_vl_policy.prompt_logprobs(convs)
    for conv, (ids, logprobs) in zip(convs, grouped, strict=True):
        ((alone_ids, alone),) = tiny_vl_policy.prompt_logprobs([conv])
        assert ids == alone_ids
        assert logprobs[0] is None and alone[0] is None
        assert logprobs[1:] == pytest.approx(alone[1:], abs=1e-4)
    # another image scores the same reply differently: rows did not read each other's images
    assert grouped[0][1][-3:] != pytest.approx(grouped[len(options)][1][-3:], abs=1e-4)
