"""Evidence-aware routing (`agent.route_prior`): the policy's own preference among the KBs, fused with how close each
KB's content is to the sub-question it wrote.

A plan step's KB is then `argmax_k log p(k | plan so far) + w * (a_k - max_j a_j)`, where `p` is the policy's
probability of writing KB `k` inside `<ret>` (renormalised over the KBs), and `a_k` is the KB's *affinity*: the
largest cosine between the sub-question and the KB's docs under a small text encoder (MiniLM by default), less a size
term `s * sqrt(2 ln n)` for a KB of n docs. With w = 0 the policy routes alone. The policy still decides whether to
search at all; only the KB of a search moves.

Why: a 135M router routes by the words of the question, and a question with no cue of its KB ("Which animals are
chained on both sides of Sinbad?") goes to the text KB, while the clip KB holds a shot note naming the lions. The
affinity sees the content; the policy's log-probability keeps what it knows better (which of two table KBs holds a
statement's table), so neither alone routes as well as the sum.

A KB's affinity needs its docs' text here: a KB served elsewhere (a retrieval service, Milvus) or holding no text
has none, and a plan that picks it stands; otherwise the choice is among the KBs that have one. The doc embeddings
(a KB's *profile*) are computed once and cached in the KB's index folder, keyed by the encoder and the docs.

Why the size term: the largest of n cosines grows with n even for unrelated text (the expected largest of n normal
draws is about `mean + sd * sqrt(2 ln n)`), so a big KB wins questions that name no content of any KB.
WikiTableQuestions questions ("who was champion the least?") name no table: by the raw largest cosine the 210-table WTQ
KB lost 44 of the validation part's 60 to the 1,000-table TabFact KB and the 7,760-passage text KB. With s = 0.08
(about the spread of one question's cosines over a KB) content-only routing put 196 of the validation part's 240 first
searches in the gold KB instead of 169; s from 0.08 to 0.12 scored alike there, and 0.08 moved the fewest text
questions (docs/stop41/).

A router's log-probabilities only know the KB names it was trained under. Listed under other names ("Encyclopedia
Passages", "Source A") the shipped router sent 2 % of the scoreboard's text searches to the text KB, and the fused
choice at w = 10 routed 69 % (opaque names: 56 %) of first searches right where the affinity alone routes 85 %
(docs/stop40/). So under `auto`, a router whose adapter records its training names (`kbrouter_router.json`) routes
by content alone (`CONTENT_ONLY`: the KB of the best affinity, no log-probabilities read) when a listed KB's name is
not one of them.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from agent.kbs import KnowledgeBase
    from retrievers.encoders import Encoder
    from retrievers.types import Doc

logger = logging.getLogger(__name__)

# `agent.route_prior: null` (auto, the CLI's default): chosen on the validation part and the held-out plan steps, not
# on the scoreboard; first searches routed right stay level from 5 to 20 on both and fall from 30 (stop 38)
AUTO_WEIGHT = 10.0
PROFILE_CHARS = 1000  # of each doc's text, as encoded (MiniLM reads 256 word pieces anyway)
PROFILE_MAX_DOCS = 50_000  # more are subsampled evenly: the max cosine over a sample still finds the topic
PROFILE_FILE = "route_profile.npz"
SIZE_PRIOR = 0.08  # s of the size term, chosen on the validation part's first searches (stop 41), not the scoreboard
CONTENT_ONLY = math.inf  # the weight at which the affinity alone picks the KB (the policy's log-probs are not read)


def fuse(logprobs: dict[str, float], affinity: dict[str, float], weight: float) -> str:
    """The KB maximising `logprobs[k] + weight * (affinity[k] - max affinity)` over the KBs in `affinity`.

    `logprobs` are the policy's (any base); KBs missing from `affinity` are not candidates. Ties keep `logprobs`'
    order, so equal scores never depend on dict order elsewhere.
    """
    candidates = [k for k in logprobs if k in affinity]
    if not candidates:
        raise ValueError("fuse needs at least one KB with both a log-probability and an affinity")
    best = max(affinity[k] for k in candidates)
    return max(candidates, key=lambda k: logprobs[k] + weight * (affinity[k] - best))


def normalized(logprobs: Sequence[float]) -> list[float]:
    """Log-probabilities renormalised over the options (the grammar allows only these)."""
    x = np.asarray(logprobs, dtype=np.float64)
    return (x - np.logaddexp.reduce(x)).tolist()


def _profile_key(encoder_name: str, docs: Sequence[Doc]) -> str:
    h = hashlib.sha256(f"{encoder_name}\n{PROFILE_CHARS}\n{PROFILE_MAX_DOCS}\n".encode())
    for d in docs:
        h.update(f"{d.id}\t{len(d.text)}\n".encode())
    return h.hexdigest()[:16]


def _profile_texts(docs: Sequence[Doc]) -> list[str]:
    picked = (
        docs
        if len(docs) <= PROFILE_MAX_DOCS
        else [docs[round(i * len(docs) / PROFILE_MAX_DOCS)] for i in range(PROFILE_MAX_DOCS)]
    )
    return [
        (f"{d.title}: " if d.title and d.title not in d.text[:200] else "") + d.text[:PROFILE_CHARS]
        for d in picked
        if d.text.strip()
    ]


def kb_profile(kb: KnowledgeBase, encoder: Encoder) -> np.ndarray | None:
    """Unit-norm embeddings of the KB's docs (n, dim), cached in its index folder; None when it has no local text."""
    from agent.kbs import local_docs

    docs = local_docs(kb.retriever)
    texts = _profile_texts(docs) if docs else []
    if not texts:
        return None
    key = _profile_key(encoder.name, docs)
    folder = getattr(getattr(kb.retriever, "cfg", None), "index_dir", None)
    path = Path(folder) / PROFILE_FILE if folder else None
    if path is not None and path.is_file():
        try:
            with np.load(path) as data:
                if str(data["key"]) == key:
                    return data["vectors"]
        except (OSError, KeyError, ValueError) as e:
            logger.warning("KB %s: unreadable routing profile %s (%s); encoding again", kb.name, path, e)
    logger.info(
        "KB %s: encoding %d docs for the routing prior (once; cached in its index folder)", kb.name, len(texts)
    )
    vectors = encoder.encode(texts, progress=len(texts) > 2000)
    if path is not None:
        try:
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, vectors=vectors, key=np.array(key))
            tmp.replace(path)
        except OSError as e:  # a read-only index folder: the profile is rebuilt next time, nothing else changes
            logger.warning("KB %s: could not cache its routing profile in %s (%s)", kb.name, path.parent, e)
    return vectors


class RoutePrior:
    """The affinities of a KB set (keyed by display name) and the fused choice. Built once per agent."""

    def __init__(
        self, kbs: dict[str, KnowledgeBase], weight: float, encoder: str = "minilm", size_prior: float = SIZE_PRIOR
    ) -> None:
        from retrievers.encoders import load_encoder

        if not weight > 0:
            raise ValueError(f"a route prior needs a weight > 0, got {weight}")
        if not size_prior >= 0:
            raise ValueError(f"agent.route_prior_size must be >= 0, got {size_prior}")
        self.weight = weight
        self.content_only = weight == CONTENT_ONLY
        self.encoder = load_encoder(encoder)
        profiles = {name: kb_profile(kb, self.encoder) for name, kb in kbs.items()}
        self.profiles = {name: p for name, p in profiles.items() if p is not None}
        if missing := sorted(set(kbs) - set(self.profiles)):
            logger.info("route prior: no local text to profile for %s; a plan that picks one of them stands", missing)
        self.size_penalty = {name: size_prior * math.sqrt(2 * math.log(len(p))) for name, p in self.profiles.items()}

    def affinity(self, sub_questions: Sequence[str]) -> list[dict[str, float]]:
        """Per sub-question, the largest cosine with each profiled KB's docs, less the KB's size term."""
        q = self.encoder.encode(list(sub_questions))
        per_kb = {name: (p @ q.T).max(axis=0) - self.size_penalty[name] for name, p in self.profiles.items()}
        return [{name: float(v[i]) for name, v in per_kb.items()} for i in range(len(sub_questions))]

    def contested(self, picked: str, affinity: dict[str, float]) -> bool:
        """Whether the affinity can move a pick: another KB is closer to the sub-question. A pick that is also the
        affinity's best stands without reading the policy's log-probs (it already outweighed the others under greedy
        decoding, and the affinity term only lowers them)."""
        return picked in affinity and max(affinity, key=affinity.__getitem__) != picked

    def choose(self, picked: str, logprobs: dict[str, float], affinity: dict[str, float]) -> str:
        """The fused KB (content only: the best affinity); a pick without an affinity (its KB has no profile)
        stands."""
        if picked not in affinity:
            return picked
        if self.content_only:
            return max(affinity, key=affinity.__getitem__)
        return fuse(logprobs, affinity, self.weight)

    def describe(self, logprobs: dict[str, float], affinity: dict[str, float], picked: str, chosen: str) -> dict:
        """What a step records of its routing (`Step.route`)."""
        return {
            "policy_kb": picked,
            "kb": chosen,
            "weight": None if self.content_only else self.weight,  # None: content only (JSON has no infinity)
            "logprobs": {k: round(v, 4) for k, v in logprobs.items()},
            "affinity": {k: round(v, 4) for k, v in affinity.items()},
        }
