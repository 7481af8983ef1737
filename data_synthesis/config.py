"""The `kbrouter synth` recipe: one `SynthConfig` dataclass, read from YAML, overridden by `--key value` flags.

A recipe looks like::

    inputs:
      - {path: ../../../shared/data/text/questions.jsonl, format: shared_text, limit: 24}
    kb_config: ../kb/demo.yaml
    teacher: {backend: transformers, model: smollm2}
    m: 2
    temperature: 0.7
    max_steps: 2
    output_dir: runs/synth/smollm2_cpu

The annotation teacher (`teacher: {backend: annotation}`, `data_synthesis.annotation`) needs no model: it builds gold
trajectories from each dataset's own supervision and checks them with the real retrievers; each input then names the
KB its gold steps search (`kb: wiki`), and `exclude_split: ../../data/splits/shared_heldout.json` keeps held-out
questions out of training.

Paths inside the YAML (`inputs[].path`, `inputs[].image_root`, `inputs[].exclude_split`, `kb_config`) resolve against
the YAML file's folder, as in KB files; `output_dir` and every path given as a flag resolve against the working
directory. Nested keys are overridden with dots: `--teacher.model /models/qwen --rejection.require_no_format_errors
true`. The file and the flags are read by `retrievers.config_file` (one YAML dialect: `1e-4` is a float, `no` a
string). Loading has no side effects (nothing is created or loaded).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from agent.backends.factory import BACKENDS, PolicyConfig
from agent.loop import AgentConfig
from agent.protocol import DEFAULT_PROMPT, PromptSettings
from retrievers.config_file import check_keys, drop_new_at_default, load_config_file

INPUT_FORMATS = ("generic", "shared_text", "r1router", "tabfact", "wtq", "coco", "video", "r1router_steps")
ANNOTATION = "annotation"  # the teacher that needs no model (data_synthesis.annotation)
TEACHERS = (*BACKENDS, ANNOTATION)
EXPORT_FORMATS = ("parquet", "disk", "none")


@dataclass(frozen=True)
class InputSpec:
    """One QA file (JSONL, JSON or parquet, read with `datasets`) and how to read it."""

    path: str = field(metadata={"help": "file, or a folder for `tabfact` (../shared/data/table/tabfact)"})
    format: str = field(default="generic", metadata={"help": f"one of {INPUT_FORMATS}"})
    dataset: str = field(default="", metadata={"help": "name used in ids and summaries; default: from the rows/file"})
    columns: dict = field(default_factory=dict, metadata={"help": "generic: {id, question, answers, image} -> column"})
    image_root: str = field(default="", metadata={"help": "folder of the images (r1router/coco); empty = text only"})
    image_pattern: str = field(
        default="{image_id}.jpg", metadata={"help": "r1router image file name under image_root"}
    )
    limit: int | None = field(default=None, metadata={"help": "first N rows only"})
    exclude_split: str = field(
        default="",
        metadata={
            "help": "held-out split JSON (scripts/make_splits.py): its questions, tables and images are never read"
        },
    )
    sample: int | None = field(default=None, metadata={"help": "N rows drawn at random (seeded) after exclusion"})
    seed: int = field(default=0, metadata={"help": "seed of `sample`"})
    kb: str = field(default="", metadata={"help": "annotation teacher: the KB name its gold steps search"})
    describe_image: bool = field(
        default=False,
        metadata={"help": "annotation, coco: describe the photo in the sub-question by one of its captions"},
    )
    kb_map: dict = field(
        default_factory=dict,
        metadata={"help": "r1router_steps: paper retriever name -> KB name, e.g. {text retriever: wiki}"},
    )

    def __post_init__(self) -> None:
        from retrievers.config import check_field_types

        check_field_types(self, f"input {self.path!r}: ")
        if self.format not in INPUT_FORMATS:
            raise ValueError(f"input {self.path!r}: unknown format {self.format!r}; use one of {INPUT_FORMATS}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"input {self.path!r}: `limit` must be >= 1 or null, got {self.limit}")
        if self.sample is not None and self.sample < 1:
            raise ValueError(f"input {self.path!r}: `sample` must be >= 1 or null, got {self.sample}")


@dataclass(frozen=True)
class TeacherSpec:
    """The teacher policy: an `agent.backends.factory.PolicyConfig` (backend, model, ...) plus retry settings."""

    backend: str = field(default="transformers", metadata={"help": f"one of {TEACHERS}"})
    model: str = field(default="smollm2", metadata={"help": "local folder, hub name, `smollm2`, or served model name"})
    dtype: str = "float32"
    device: str | None = None
    max_batch_size: int = field(default=16, metadata={"help": "conversations per generate call"})
    kwargs: dict = field(
        default_factory=dict,
        metadata={"help": "other PolicyConfig keys: base_url, tensor_parallel_size, max_model_len, ..."},
    )
    retries: int = field(default=3, metadata={"help": "retries of a failed request before `backend_error`"})
    backoff_s: float = field(default=2.0, metadata={"help": "first back-off; doubles on each retry"})

    def __post_init__(self) -> None:
        from retrievers.config import check_field_types

        check_field_types(self, "teacher.")
        if self.retries < 0 or self.backoff_s < 0:
            raise ValueError("teacher.retries and teacher.backoff_s must be >= 0; e.g. `retries: 3, backoff_s: 2`")
        if self.backend != ANNOTATION:
            self.policy_config()  # validates backend and kwargs now, before anything loads

    def policy_config(self) -> PolicyConfig:
        """The backend settings as `agent.backends.factory.PolicyConfig`."""
        if self.backend == ANNOTATION:
            raise ValueError("the annotation teacher has no policy; it runs through data_synthesis.annotation")
        return PolicyConfig.from_dict({"backend": self.backend, "model": self.model, "dtype": self.dtype,
                                       "device": self.device, "max_batch_size": self.max_batch_size, **self.kwargs},
                                      where="teacher")  # fmt: skip


@dataclass(frozen=True)
class RejectionSpec:
    """Rules beyond the always-on one (final answer F1-recall = 1 against the best gold)."""

    require_no_format_errors: bool = field(default=False, metadata={"help": "reject any format error, even re-asked"})
    require_evidence_overlap: bool = field(default=False, metadata={"help": "intermediate answers must overlap hits"})
    min_evidence_overlap: float = field(default=0.5, metadata={"help": "share of answer tokens found in evidence"})
    max_steps: int | None = field(default=None, metadata={"help": "at most this many retrieval steps"})

    def __post_init__(self) -> None:
        from retrievers.config import check_field_types

        check_field_types(self, "rejection.")
        if not 0 < self.min_evidence_overlap <= 1:
            raise ValueError(f"rejection.min_evidence_overlap must be in (0, 1], got {self.min_evidence_overlap}")
        if self.max_steps is not None and self.max_steps < 0:
            raise ValueError(f"rejection.max_steps must be >= 0 or null, got {self.max_steps}")


@dataclass
class SynthConfig:
    """Everything a synthesis job needs; see the module docstring for the YAML shape."""

    inputs: list = field(default_factory=list, metadata={"help": "list of InputSpec mappings"})
    kb_config: str | list = field(default="", metadata={"help": "KB YAML file(s) (configs/kb/*.yaml)"})
    kbs: list | None = field(default=None, metadata={"help": "KB names to keep from kb_config; default all"})
    build_kbs: bool = field(default=True, metadata={"help": "build missing/stale indexes before starting"})
    teacher: TeacherSpec | dict = field(default_factory=TeacherSpec)
    rejection: RejectionSpec | dict = field(default_factory=RejectionSpec)
    m: int = field(default=4, metadata={"help": "sampled trajectories per question"})
    temperature: float = field(default=0.7, metadata={"help": "> 0, or the m samples are identical"})
    top_p: float = 1.0
    top_k: int = 0
    max_steps: int = field(default=3, metadata={"help": "retrieval steps before the final answer (paper: 3)"})
    top_k_hits: int = field(default=5, metadata={"help": "hits shown per retrieval"})
    plan_tokens: int = 256
    answer_tokens: int = 256
    final_tokens: int = 256
    max_retries: int = field(default=1, metadata={"help": "format re-asks per step"})
    require_think: bool = True
    few_shot: bool = True
    # The teacher's agent settings (`agent.loop.AgentConfig`), so a job can roll out a trained router exactly as it
    # runs at inference (self-distillation: `configs/synth/self_rft_cpu.yaml`); step records show the evidence at
    # `evidence_chars`, as the teacher read it. `constrained` is off by default: a teacher writes freely and rejection
    # judges it (what every recipe did before stop 32, when the retry wrapper hid the backend's structured output).
    constrained: str = field(default="off", metadata={"help": "decode inside the step grammar: on | off | auto"})
    min_steps: int = field(default=0, metadata={"help": "searches before the teacher may stop"})
    evidence_chars: int = field(default=DEFAULT_PROMPT.evidence_chars, metadata={"help": "longest evidence per hit"})
    evidence_focus: str = field(
        default=DEFAULT_PROMPT.evidence_focus,
        metadata={"help": "which longer hits show their parts nearest the sub-question: head | tables | all"},
    )
    seed: int = field(default=0, metadata={"help": "base seed; each batch's seed derives from it and its first id"})
    questions_per_batch: int = field(default=8, metadata={"help": "questions per lockstep batch (x m trajectories)"})
    output_dir: str = field(default="runs/synth", metadata={"help": "output folder (shards go under shards/)"})
    shard: int = field(default=0, metadata={"help": "this job's shard, 0-based"})
    num_shards: int = field(default=1, metadata={"help": "shards the questions are split into (by id hash)"})
    export_format: str = field(default="parquet", metadata={"help": f"one of {EXPORT_FORMATS}"})
    progress: bool = field(default=True, metadata={"help": "progress bar with rate and ETA"})
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        inputs = []
        for i, spec in enumerate(self.inputs or []):
            if isinstance(spec, dict):
                check_keys(InputSpec, spec, f"inputs[{i}]")
                spec = InputSpec(**spec)
            inputs.append(spec)
        self.inputs = inputs
        if isinstance(self.teacher, dict):
            check_keys(TeacherSpec, self.teacher, "teacher")
            self.teacher = TeacherSpec(**self.teacher)
        if isinstance(self.rejection, dict):
            check_keys(RejectionSpec, self.rejection, "rejection")
            self.rejection = RejectionSpec(**self.rejection)
        from retrievers.config import check_field_types

        check_field_types(self)
        if self.m < 1:
            raise ValueError(f"`m` ({self.m}) must be >= 1 samples per question; e.g. `m: 4`")
        for key in ("top_k_hits", "plan_tokens", "answer_tokens", "final_tokens", "num_shards"):
            if getattr(self, key) < 1:
                raise ValueError(f"`{key}` must be >= 1, got {getattr(self, key)}")
        if self.max_retries < 0 or self.top_k < 0:
            raise ValueError(f"`max_retries` and `top_k` must be >= 0, got {self.max_retries} and {self.top_k}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"need `temperature` >= 0 and 0 < `top_p` <= 1, got {self.temperature} and {self.top_p}; "
                "e.g. `temperature: 0.7, top_p: 1.0`"
            )
        if self.teacher.backend == ANNOTATION:
            if self.m != 1:
                raise ValueError(f"`m` is {self.m}, but the annotation teacher writes one gold trajectory per "
                                 "question; set `m: 1`")  # fmt: skip
            missing = [s.path for s in self.inputs if not s.kb and s.format != "r1router_steps"]
            if missing:
                raise ValueError(f"the annotation teacher needs the KB each input's gold steps search; set e.g. "
                                 f"`kb: wiki` on input(s) {missing}")  # fmt: skip
            unmapped = [s.path for s in self.inputs if s.format == "r1router_steps" and not s.kb_map]
            if unmapped:
                raise ValueError(f"r1router_steps input(s) {unmapped} need `kb_map` (paper retriever -> KB name), "
                                 "e.g. `kb_map: {text retriever: wiki, table retriever: wtq}`")  # fmt: skip
        if self.m > 1 and self.temperature <= 0:
            raise ValueError(f"`m` is {self.m} but temperature is {self.temperature}: greedy samples are identical; "
                             "set e.g. `temperature: 0.7`")  # fmt: skip
        if self.max_steps < 0 or self.questions_per_batch < 1:
            raise ValueError("`max_steps` must be >= 0 and `questions_per_batch` >= 1")
        if not 0 <= self.shard < self.num_shards:
            raise ValueError(f"--shard {self.shard} is out of range for --num-shards {self.num_shards}; "
                             f"use 0..{self.num_shards - 1}")  # fmt: skip
        if self.export_format not in EXPORT_FORMATS:
            raise ValueError(f"unknown export_format {self.export_format!r}; use one of {EXPORT_FORMATS}")
        try:  # the agent settings are checked now (constrained, min_steps, evidence_chars)
            self.agent_config(self.seed)
        except ValueError as e:
            raise ValueError(f"the teacher's step loop: {e} (recipe keys `constrained`, `min_steps`, ...)") from None

    def agent_config(self, seed: int) -> AgentConfig:
        """The teacher's step loop, seeded per batch (`job.batch_seed`)."""
        return AgentConfig(
            max_steps=self.max_steps, top_k=self.top_k_hits, max_retries=self.max_retries,
            plan_tokens=self.plan_tokens, answer_tokens=self.answer_tokens, final_tokens=self.final_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k_sampling=self.top_k, seed=seed,
            require_think=self.require_think, few_shot=self.few_shot, constrained=self.constrained,
            min_steps=self.min_steps, evidence_chars=self.evidence_chars, evidence_focus=self.evidence_focus,
        )  # fmt: skip

    @property
    def step_prompt(self) -> PromptSettings:
        """How step records render their prompts: no worked example (the trained router's inference prompts),
        whatever the teacher was shown, and the evidence as the teacher read it."""
        return PromptSettings(few_shot=False, evidence_chars=self.evidence_chars, evidence_focus=self.evidence_focus)

    def result_hash(self) -> str:
        """Hash of every setting that changes which records a batch produces (not shard, output or logging)."""
        skip = {"shard", "output_dir", "progress", "log_level", "build_kbs"}
        d = {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}
        d["teacher"] = {k: v for k, v in d["teacher"].items() if k not in ("retries", "backoff_s", "max_batch_size")}
        d = drop_new_at_default(d, NEW_AT_DEFAULT)  # runs started before these keys existed keep their hash
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# keys added after runs were hashed, at the value that behaves as before (`retrievers.config_file.drop_new_at_default`)
NEW_AT_DEFAULT = {
    "constrained": "off", "min_steps": 0, "evidence_chars": DEFAULT_PROMPT.evidence_chars, "evidence_focus": DEFAULT_PROMPT.evidence_focus,
}  # fmt: skip
PATH_KEYS = ("inputs.*.path", "inputs.*.image_root", "inputs.*.exclude_split", "kb_config")  # YAML-relative


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> SynthConfig:
    """Build a `SynthConfig` from a YAML recipe and `--key value` overrides (dots reach nested keys), read by
    `retrievers.config_file` (its YAML dialect; `PATH_KEYS` resolve against the recipe's folder).

    Raises:
        FileNotFoundError: the recipe does not exist.
        ValueError: an unknown key (named, with the file and the closest valid keys) or an invalid value.
    """
    return load_config_file(SynthConfig, path, overrides or [], path_keys=PATH_KEYS, what="synth recipe")
