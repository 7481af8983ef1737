"""The eval config: one dataclass read from YAML, with `key=value` overrides from the command line.

Paths in the YAML (`kb_config`, `shared_data`, `corpora_dir`, dataset `path`/`image_root`, checkpoint models that
exist there) resolve against the YAML file's folder; `output_dir` resolves against the working directory.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import yaml

from agent.loop import AgentConfig
from eval.datasets import SPEC_KEYS, DatasetSpec


@dataclass
class EvalConfig:
    """Datasets × methods over one KB set and one policy (plus optional checkpoint policies)."""

    name: str = field(default="eval", metadata={"help": "Run name (report title)."})
    output_dir: str = field(default="outputs/eval/run", metadata={"help": "Report, plots and prediction cache."})
    kb_config: str = field(default="", metadata={"help": "A configs/kb/*.yaml file."})
    shared_data: str = field(default="../../../shared/data", metadata={"help": "The shared data folder."})
    prepare_corpora: list = field(default_factory=list, metadata={"help": "Derived corpora to write (eval.corpora)."})
    corpora_dir: str = field(default="../../outputs/eval_corpora", metadata={"help": "Where derived corpora go."})
    policy: dict = field(default_factory=lambda: {"backend": "transformers", "model": "smollm2"},
                         metadata={"help": "agent.backends.factory.PolicyConfig fields."})
    checkpoints: dict = field(default_factory=dict, metadata={
        "help": "Extra agent methods: name -> model path or policy mapping (SFT / Step-GRPO checkpoints)."})
    agent: dict = field(default_factory=dict, metadata={"help": "AgentConfig fields (max_steps, top_k, tokens...)."})
    k_per_kb: int = field(default=2, metadata={"help": "Hits per KB for rag_all / ircot / iter_retgen."})
    methods: list = field(default_factory=lambda: ["no_retrieval", "single_kb", "rag_all", "ircot", "iter_retgen",
                                                   "router", "agent", "agent_random"],
                          metadata={"help": "Method names (see eval.methods); `single_kb` = one rag_<kb> per KB."})
    datasets: list = field(default_factory=list, metadata={"help": "DatasetSpec mappings."})
    dataset_defaults: dict = field(default_factory=dict, metadata={"help": "Keys applied to every dataset."})
    batch_size: int = field(default=16, metadata={"help": "Questions per lockstep batch (and per cache flush)."})
    seed: int = field(default=0, metadata={"help": "Seed of sampling and of the random-routing ablation."})
    plot_method: str = field(default="agent", metadata={"help": "Method whose KB choices the routing plot shows."})
    source_file: str = field(default="", metadata={"help": "Set by the loader."})

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {self.batch_size}; e.g. `batch_size: 16`")
        from agent.backends.factory import PolicyConfig

        PolicyConfig.from_dict(self.policy, "policy")  # validates keys and backend; loads nothing
        for name, ckpt in self.checkpoints.items():
            if not isinstance(ckpt, (str, dict)):
                raise ValueError(f"checkpoints.{name}: give a model path or a policy mapping, got {ckpt!r}")
            if isinstance(ckpt, dict):
                PolicyConfig.from_dict(ckpt, f"checkpoints.{name}")
        agent_keys = {f.name for f in fields(AgentConfig)}
        unknown = set(self.agent) - agent_keys
        if unknown:
            raise ValueError(f"`agent` has unknown key(s) {sorted(unknown)}; valid: {sorted(agent_keys)}")
        unknown = set(self.dataset_defaults) - set(SPEC_KEYS)
        if unknown:
            raise ValueError(f"`dataset_defaults` has unknown key(s) {sorted(unknown)}; valid: {SPEC_KEYS}")
        if not self.datasets:
            raise ValueError("`datasets` is empty; list at least one, e.g. `datasets: [{name: hotpotqa, loader: hotpotqa}]`")
        names = [d.get("name") for d in self.datasets]
        if len(set(names)) != len(names):
            raise ValueError(f"dataset names must be unique, got {names}")

    def agent_config(self) -> AgentConfig:
        return AgentConfig(**{"seed": self.seed, **self.agent})

    def dataset_specs(self) -> list[DatasetSpec]:
        base = Path(self.source_file).parent if self.source_file else Path(".")
        specs = []
        for i, d in enumerate(self.datasets):
            d = {**self.dataset_defaults, **d}
            unknown = set(d) - set(SPEC_KEYS)
            if unknown:
                raise ValueError(f"datasets[{i}] ({d.get('name', '?')}): unknown key(s) {sorted(unknown)}; "
                                 f"valid: {SPEC_KEYS}")
            for key in ("path", "image_root"):
                if d.get(key):
                    d[key] = str(_resolve(d[key], base))
            specs.append(DatasetSpec(**d))
        return specs

    def path(self, key: str) -> Path:
        """A path setting resolved against the config file's folder."""
        base = Path(self.source_file).parent if self.source_file else Path(".")
        return _resolve(getattr(self, key), base)

    def fingerprint(self, method: str) -> str:
        """Hash of what determines a method's predictions: a cached one with another hash is recomputed."""
        policy = self.checkpoints[method] if method in self.checkpoints else self.policy
        blob = json.dumps({"method": method, "policy": policy, "agent": asdict(self.agent_config()),
                           "k_per_kb": self.k_per_kb, "kb_config": str(self.kb_config)}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _resolve(value: str, base: Path) -> Path:
    p = Path(os.path.expandvars(str(value))).expanduser()
    return p if p.is_absolute() else base / p


def apply_override(data: dict, override: str) -> None:
    """Apply one `a.b.c=value` override (value parsed as YAML) to a nested dict, in place.

    Raises:
        ValueError: not of the form key=value.
    """
    if "=" not in override:
        raise ValueError(f"override {override!r} is not key=value (e.g. `agent.max_steps=2`)")
    key, _, raw = override.partition("=")
    node = data
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {override!r}: {part!r} is not a mapping")
    node[parts[-1]] = yaml.safe_load(raw)


def load_eval_config(path: str | Path, overrides: list[str] = ()) -> EvalConfig:
    """Read an eval YAML and apply overrides.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown key (named, with the valid ones) or an invalid value.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"eval config {str(path)!r} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of eval settings")
    data = copy.deepcopy(data)
    for o in overrides:
        apply_override(data, o)
    valid = [f.name for f in fields(EvalConfig) if f.name != "source_file"]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; valid keys: {', '.join(valid)}")
    try:
        return EvalConfig(**data, source_file=str(path))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from e
