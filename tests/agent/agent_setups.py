"""Agent setups for the agent-server tests: StepPolicy over four in-memory KBs (text, table, image, clip) whose
image and clip hits point at real files in a media folder made under `tmp_path`."""

from __future__ import annotations

import re
from pathlib import Path

from agent.agent_server import AgentSetup
from agent.kbs import KnowledgeBase
from agent.loop import AgentConfig
from retrievers.types import Doc, Hit, Media, Query, as_queries
from tests.fakes import StepPolicy


class DocRetriever:
    """Ranks its docs by word overlap with the query; records every query (text and image)."""

    def __init__(self, name: str, docs: list[Doc]) -> None:
        self.name = name
        self.docs = docs
        self.queries: list[Query] = []

    def search(self, queries: list[str | Query], k: int) -> list[list[Hit]]:
        out = []
        for q in as_queries(queries):
            self.queries.append(q)
            words = set(re.findall(r"\w+", q.text.lower()))
            scored = sorted(
                self.docs,
                key=lambda d: (-len(words & set(re.findall(r"\w+", (d.title + " " + d.text).lower()))), d.id),
            )
            out.append(
                [Hit(doc=d, score=round(1.0 / (r + 1), 3), rank=r, kb=self.name) for r, d in enumerate(scored[:k])]
            )
        return out


def make_media(folder: Path) -> tuple[Path, Path]:
    """A small PNG photo and a stand-in video file inside `folder` (the KBs' media folder)."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    photo = folder / "horses.png"
    im = Image.new("RGB", (96, 64), (90, 160, 80))
    ImageDraw.Draw(im).rectangle((20, 20, 60, 50), fill=(120, 80, 40))
    im.save(photo)
    video = folder / "popeye.mp4"
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64)
    return photo, video


def make_setups(tmp_path: Path, policy: StepPolicy | None = None, max_steps: int = 2) -> tuple[list[AgentSetup], Path]:
    """Two models over the same KBs: `kbrouter-demo` (text-only policy) and `kbrouter-vision`; returns the media
    folder too."""
    media = tmp_path / "media"
    photo, video = make_media(media)
    text = DocRetriever(
        "text",
        [
            Doc("marie", "Marie Curie was born in Warsaw and won two Nobel prizes.", "Marie Curie", "text"),
            Doc("hamlet", "Hamlet is a tragedy written by William Shakespeare.", "William Shakespeare", "text"),
            Doc("warsaw", "Warsaw is the capital of Poland.", "Warsaw", "text"),
        ],
    )
    table = DocRetriever(
        "table",
        [
            Doc(
                "medals",
                "Title: 1994 Winter Olympics medal table\n| nation | gold |\n| Norway | 10 |\n| Germany | 9 |",
                "Norway",
                "table",
                modality="table",
            )
        ],
    )
    image = DocRetriever(
        "image",
        [
            Doc(
                "coco-1",
                "Horses standing on a green hill.",
                "Horses",
                "image",
                modality="image",
                media=Media(str(photo)),
            )
        ],
    )
    clip = DocRetriever(
        "clip",
        [
            Doc("popeye-3", "Popeye sings about being a sailor.", "Popeye", "clip", modality="video",
                media=Media(str(video), 12.5, 20.0)),
        ],
    )  # fmt: skip
    kbs = {
        "Text KB": KnowledgeBase("text", "Text KB", text, 3, "Wikipedia paragraphs"),
        "Table KB": KnowledgeBase("table", "Table KB", table, 2, "Wikipedia tables"),
        "Image KB": KnowledgeBase("image", "Image KB", image, 2, "captioned photos"),
        "Clip KB": KnowledgeBase("clip", "Clip KB", clip, 2, "cartoon scenes"),
    }
    policy = policy or StepPolicy()
    cfg = AgentConfig(max_steps=max_steps, min_steps=1, constrained="off")
    setups = [
        AgentSetup("kbrouter-demo", policy, kbs, cfg, vision=False, description="text-only"),
        AgentSetup("kbrouter-vision", policy, kbs, cfg, vision=True, description="reads images"),
    ]
    return setups, media
