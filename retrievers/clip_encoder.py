"""The CLIP model of media KBs: open_clip loading (once per process) and image/text embedding into one space.

`clip_model` is an open_clip name (e.g. `ViT-L-14`) or a config in `retrievers/clip_configs/` (e.g.
`kbrouter-tiny-clip`); `clip_pretrained` is an open_clip tag such as `openai`, a checkpoint path, or None for random
weights (no download).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from retrievers.encoders import normalize

CLIP_CONFIG_DIR = Path(__file__).parent / "clip_configs"


class ClipEncoder:
    """An open_clip model that embeds images (PIL) and texts into one L2-normalised space."""

    def __init__(self, model: str, pretrained: str | None, device: str | None = None, batch_size: int = 32):
        try:
            import open_clip
            import torch
        except ImportError as e:
            raise ImportError("image/video KBs need open_clip: pip install 'kbrouter[image]' (open_clip_torch)") from e
        open_clip.add_model_config(CLIP_CONFIG_DIR)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model, _, self.preprocess = open_clip.create_model_and_transforms(
            model, pretrained=pretrained, device=self.device
        )
        self.model.eval()
        self.tokenizer = open_clip.get_tokenizer(model)
        self.name = f"{model}/{pretrained}"
        self.batch_size = batch_size
        self.dim = int(self.encode_texts(["dimension probe"]).shape[1])

    def encode_images(self, images: list) -> np.ndarray:
        """(n, dim) unit vectors for RGB PIL images."""
        import torch

        if not images:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = []
        with torch.inference_mode():
            for i in range(0, len(images), self.batch_size):
                batch = torch.stack([self.preprocess(im) for im in images[i : i + self.batch_size]]).to(self.device)
                out.append(self.model.encode_image(batch).float().cpu().numpy())
        return normalize(np.concatenate(out))

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        """(n, dim) unit vectors for texts (truncated to the model's context)."""
        import torch

        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                tokens = self.tokenizer(texts[i : i + self.batch_size]).to(self.device)
                out.append(self.model.encode_text(tokens).float().cpu().numpy())
        return normalize(np.concatenate(out)) if out else np.zeros((0, 0), dtype=np.float32)


@functools.lru_cache(maxsize=2)
def load_clip(model: str, pretrained: str | None, device: str | None = None, batch_size: int = 32) -> ClipEncoder:
    """Load (once per process) an open_clip model; `pretrained=None` gives random weights and no download."""
    return ClipEncoder(model, pretrained, device, batch_size)
