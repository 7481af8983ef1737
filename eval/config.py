"""The eval config: one dataclass read from YAML, with `--key value` overrides from the command line.

Paths in the YAML (`kb_config`, `shared_data`, `corpora_dir`, dataset `path`/`image_root`/`split_file`, and policy
`model`/`adapter` paths that exist there) resolve against the YAML file's folder; `output_dir` resolves against the
working directory, and so do policy paths that do not exist next to the YAML (e.g. `runs/...` training outputs).

Agent variants are named step-agent methods, each a `policy:` and an `agent:` mapping merged onto the config's own
`policy` and `agent` (so a variant says only what differs):

    agent_variants:
      agent_sft: {policy: {adapter: runs/train/smollm2_sft_lora/final}, agent: {few_shot: false}}

A variant with `method:` runs another built-in method the same way, with its own policy and settings, e.g. the
one-shot router or rag_all answered by the trained router (a baseline with the same reader as the agent):

    agent_variants:
      rag_all_router: {method: rag_all, policy: {model: smollm2-kbrouter}, agent: {few_shot: false}}

`checkpoints: {name: path}` is the older shorthand for `agent_variants: {name: {policy: {model: path}}}`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from agent.backends.models import ROUTER_CARD
from agent.loop import AgentConfig
from eval.datasets import SPEC_KEYS, DatasetSpec
from retrievers.config_file import Gate, drop_new_at_default, read_config, resolve_path


@dataclass
class EvalConfig:
    """Datasets × methods over one KB set and one policy (plus optional checkpoint policies)."""

    name: str = field(default="eval", metadata={"help": "Run name (report title)."})
    output_dir: str = field(default="outputs/eval/run", metadata={"help": "Report, plots and prediction cache."})
    kb_config: str = field(default="", metadata={"help": "A configs/kb/*.yaml file."})
    shared_data: str = field(default="../../../shared/data", metadata={"help": "The shared data folder."})
    prepare_corpora: list = field(default_factory=list, metadata={"help": "Derived corpora to write (eval.corpora)."})
    corpora_dir: str = field(default="../../outputs/eval_corpora", metadata={"help": "Where derived corpora go."})
    policy: dict = field(
        default_factory=lambda: {"backend": "transformers", "model": "smollm2"},
        metadata={"help": "agent.backends.factory.PolicyConfig fields."},
    )
    checkpoints: dict = field(
        default_factory=dict,
        metadata={
            "help": "Shorthand agent variants: name -> model path or policy overrides (SFT / Step-GRPO checkpoints)."
        },
    )
    agent: dict = field(default_factory=dict, metadata={"help": "AgentConfig fields (max_steps, top_k, tokens...)."})
    agent_variants: dict = field(
        default_factory=dict,
        metadata={
            "help": "Named step-agent methods: name -> {policy: {...}, agent: {...}} merged onto `policy` / `agent`."
        },
    )
    method_settings: dict = field(
        default_factory=dict,
        metadata={
            "help": "AgentConfig overrides of built-in methods, merged onto `agent`: e.g. `ircot: {max_steps: 1}`."
        },
    )
    k_per_kb: int = field(default=2, metadata={"help": "Hits per KB for rag_all / ircot / iter_retgen."})
    methods: list = field(
        default_factory=lambda: [
            "no_retrieval",
            "single_kb",
            "rag_all",
            "ircot",
            "iter_retgen",
            "router",
            "agent",
            "agent_random",
        ],
        metadata={"help": "Method names (see eval.methods); `single_kb` = one rag_<kb> per KB."},
    )
    datasets: list = field(default_factory=list, metadata={"help": "DatasetSpec mappings."})
    dataset_defaults: dict = field(default_factory=dict, metadata={"help": "Keys applied to every dataset."})
    batch_size: int = field(default=16, metadata={"help": "Questions per lockstep batch (and per cache flush)."})
    seed: int = field(default=0, metadata={"help": "Seed of sampling and of the random-routing ablation."})
    plot_method: str = field(default="agent", metadata={"help": "Method drawn first in the routing-per-step plot."})
    source_file: str = field(default="", metadata={"help": "Set by the loader."})

    def __post_init__(self) -> None:
        from retrievers.config import check_field_types

        check_field_types(self)
        for key in ("policy", "checkpoints", "agent", "agent_variants", "method_settings", "dataset_defaults"):
            if not isinstance(getattr(self, key), dict):
                raise ValueError(f"`{key}` must be a mapping, got {getattr(self, key)!r}")
        for key in ("methods", "datasets", "prepare_corpora"):
            if not isinstance(getattr(self, key), list):
                raise ValueError(f"`{key}` must be a list, got {getattr(self, key)!r}")
        if self.k_per_kb < 1:
            raise ValueError(f"`k_per_kb` must be >= 1, got {self.k_per_kb}; e.g. `k_per_kb: 2`")
        if self.batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {self.batch_size}; e.g. `batch_size: 16`")
        from agent.backends.factory import PolicyConfig
        from eval.methods import reserved_method_name

        PolicyConfig.from_dict(self.policy, "policy")  # validates keys and backend; loads nothing
        _check_alias(self.policy_settings(), "policy")
        for name, ckpt in self.checkpoints.items():
            if not isinstance(ckpt, (str, dict)):
                raise ValueError(f"checkpoints.{name}: give a model path or a policy mapping, got {ckpt!r}")
        _check_agent_keys(self.agent, "`agent`")
        both = sorted(set(self.checkpoints) & set(self.agent_variants))
        if both:
            raise ValueError(f"{both} named in both `checkpoints` and `agent_variants`; keep one")
        for name, variant in self.variants().items():
            where = f"checkpoints.{name}" if name in self.checkpoints else f"agent_variants.{name}"
            if reserved_method_name(name):
                why = " (rag_* names are the single-KB methods, rag_<kb>)" if name.startswith("rag_") else ""
                raise ValueError(
                    f"{where}: {name!r} is a built-in method name{why}; call the variant e.g. {_free_name(name)}"
                )
            if not isinstance(variant, dict):
                raise ValueError(f"{where}: expected a mapping {{policy: {{...}}, agent: {{...}}}}, got {variant!r}")
            unknown = sorted(set(variant) - set(VARIANT_KEYS))
            if unknown:
                raise ValueError(f"{where}: unknown key(s) {unknown}; valid: {list(VARIANT_KEYS)}")
            runs = variant.get("method", AGENT)
            if not isinstance(runs, str) or not reserved_method_name(runs) or runs == "single_kb":
                raise ValueError(
                    f"{where}.method: {variant['method']!r} is not a built-in method; one of e.g. agent, router, "
                    "rag_all, no_retrieval, ircot, iter_retgen, rag_<kb>"
                )
            for key in ("policy", "agent"):
                if not isinstance(variant.get(key, {}), dict):
                    raise ValueError(f"{where}.{key}: expected a mapping of overrides, got {variant[key]!r}")
            PolicyConfig.from_dict(self.policy_settings(name), f"{where}.policy")
            _check_alias(self.policy_settings(name), f"{where}.policy")
            _check_agent_keys(variant.get("agent", {}), f"{where}.agent")
            self._agent(name, where)
        self._agent("", "`agent`")
        for name, overrides in self.method_settings.items():
            where = f"method_settings.{name}"
            if name in self.variants():
                raise ValueError(
                    f"{where}: {name!r} is an agent variant; set its loop settings in its `agent:` mapping"
                )
            if not reserved_method_name(name) or name == "single_kb":
                raise ValueError(f"{where}: {name!r} is not a built-in method (e.g. ircot, rag_all, rag_<kb>, router)")
            if not isinstance(overrides, dict):
                raise ValueError(f"{where}: expected a mapping of `agent` overrides, got {overrides!r}")
            _check_agent_keys(overrides, where)
            self._agent(name, where)
        unknown = set(self.dataset_defaults) - set(SPEC_KEYS)
        if unknown:
            raise ValueError(f"`dataset_defaults` has unknown key(s) {sorted(unknown)}; valid: {SPEC_KEYS}")
        if not self.datasets:
            raise ValueError(
                "`datasets` is empty; list at least one, e.g. `datasets: [{name: hotpotqa, loader: hotpotqa}]`"
            )
        names = [d.get("name") for d in self.datasets]
        if len(set(names)) != len(names):
            raise ValueError(f"dataset names must be unique, got {names}")

    def variants(self) -> dict[str, dict]:
        """Agent variants by name (`agent_variants`, and `checkpoints` in their long form), as written."""
        out = {
            name: {"policy": {"model": ckpt} if isinstance(ckpt, str) else ckpt}
            for name, ckpt in self.checkpoints.items()
        }
        return {**out, **self.agent_variants}

    def variant_methods(self) -> dict[str, str]:
        """Variant name -> the built-in method it runs (`agent`, the step agent, unless its `method:` says another)."""
        return {name: v.get("method", AGENT) for name, v in self.variants().items()}

    def base_method(self, method: str) -> str:
        """The built-in method a method name runs: itself, or a variant's `method`."""
        return self.variant_methods().get(method, method)

    def policy_settings(self, method: str = "") -> dict:
        """The policy mapping a method runs with: `policy`, with the variant's `policy` overrides merged on top."""
        variant = self.variants().get(method)
        settings = {**self.policy, **((variant or {}).get("policy") or {})}
        base = Path(self.source_file).parent if self.source_file else Path(".")
        for key in POLICY_PATH_KEYS:
            if isinstance(settings.get(key), str):
                value = os.path.expandvars(settings[key])
                near = resolve_path(value, base)
                settings[key] = str(near) if not Path(value).is_absolute() and near.exists() else value
        return settings

    def agent_config(self, method: str = "") -> AgentConfig:
        """The loop settings a method runs with: `agent`, with the method's `method_settings` or the variant's
        `agent` overrides merged on top."""
        if method in self.checkpoints:
            where = f"checkpoints.{method}"
        elif method in self.agent_variants:
            where = f"agent_variants.{method}"
        else:
            where = f"method_settings.{method}" if method in self.method_settings else "`agent`"
        return self._agent(method, where)

    def _agent(self, method: str, where: str) -> AgentConfig:
        variant = self.variants().get(method) or {}
        try:
            overrides = {**self.method_settings.get(method, {}), **(variant.get("agent") or {})}
            return AgentConfig(**{"seed": self.seed, **self.agent, **overrides})
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from e

    def dataset_specs(self) -> list[DatasetSpec]:
        base = Path(self.source_file).parent if self.source_file else Path(".")
        specs = []
        for i, d in enumerate(self.datasets):
            d = {**self.dataset_defaults, **d}
            unknown = set(d) - set(SPEC_KEYS)
            if unknown:
                raise ValueError(
                    f"datasets[{i}] ({d.get('name', '?')}): unknown key(s) {sorted(unknown)}; valid: {SPEC_KEYS}"
                )
            for key in ("path", "image_root", "split_file"):
                if d.get(key):
                    d[key] = str(resolve_path(d[key], base))
            specs.append(DatasetSpec(**d))
        return specs

    def path(self, key: str) -> Path:
        """A path setting resolved against the config file's folder."""
        base = Path(self.source_file).parent if self.source_file else Path(".")
        return resolve_path(getattr(self, key), base)

    def policy_key(self, method: str) -> str:
        """Methods with the same key share one loaded policy."""
        return json.dumps(self.policy_settings(method), sort_keys=True, default=str)

    def fingerprint(self, method: str) -> str:
        """Hash of what determines a method's predictions: a cached one with another hash is recomputed.

        It covers the method's policy and loop settings (a variant's merged ones) and, for policy paths on this disk,
        their files' sizes and modification times, so a checkpoint retrained in place is evaluated again.
        """
        policy = self.policy_settings(method)
        data = {
            "method": method,
            # a variant that runs another built-in method (fingerprints of the others are as they were before `method:`)
            **({"runs": runs} if (runs := self.variant_methods().get(method, AGENT)) != AGENT else {}),
            "policy": policy,
            "agent": agent_fingerprint_fields(self.agent_config(method)),
            "k_per_kb": self.k_per_kb,
            "kb_config": str(self.kb_config),
        }
        paths = {key: policy.get(key) for key in POLICY_PATH_KEYS}
        paths["adapter"] = resolved_adapter(policy)  # an alias's shipped adapter too
        stamps = {key: _files_stamp(Path(p)) for key, p in paths.items() if isinstance(p, str) and Path(p).exists()}
        if stamps:  # absent for hub names and aliases, so their fingerprints are what they were before stamps
            data["weights"] = stamps
        blob = json.dumps(data, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _free_name(name: str) -> str:
    """A variant name like `name` that no built-in method takes (`rag_all` -> `all_v2`, `router` -> `router_v2`)."""
    return f"{name.removeprefix('rag_')}_v2"


def agent_fingerprint_fields(agent: AgentConfig) -> dict:
    """The loop settings a fingerprint covers: all of them, less those of `AGENT_NEW_AT_DEFAULT` at their old-behaviour
    values (settings added after predictions were cached; there, they leave every agent as it was, so its cached
    predictions stay valid)."""
    return drop_new_at_default(asdict(agent), AGENT_NEW_AT_DEFAULT)


# AgentConfig keys added after predictions were cached, at the value that behaves as before they existed
AGENT_NEW_AT_DEFAULT = {
    "evidence_focus": "head",  # each hit cut at its head
    "route_prior": Gate(0, ("route_prior_encoder", "route_prior_size")),  # off: its encoder and size term unused
    "route_prior_size": 0,  # the prior on with no size term: the affinity of the predictions cached before it existed
    "answer_words": "free",  # any answer text
    "reuse_answer": False,  # every trajectory ends with a generated final step
    "answer_samples": Gate(1, ("answer_temperature",)),  # one answer a step, no vote: its temperature unused
}


VARIANT_KEYS = ("method", "policy", "agent")
AGENT = "agent"  # what a variant runs unless its `method:` names another built-in method
POLICY_PATH_KEYS = ("model", "adapter", "plan_adapter")  # policy settings that may name a folder on disk


def resolved_adapter(policy: dict) -> str | None:
    """The adapter folder a policy mapping loads: its `adapter`, or the one a model alias brings (`smollm2-kbrouter`)."""
    from agent.backends.models import resolve_policy_model

    return resolve_policy_model(str(policy.get("model", "")), policy.get("adapter"))[1]


def _check_alias(policy: dict, where: str) -> None:
    try:
        resolved_adapter(policy)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


def _check_agent_keys(overrides: dict, where: str) -> None:
    agent_keys = {f.name for f in fields(AgentConfig)}
    unknown = set(overrides) - agent_keys
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {sorted(unknown)}; valid: {sorted(agent_keys)}")


CONTENT_HASH_BYTES = 256 * 2**20  # files up to this size are hashed by content; larger shards by size and mtime


def _router_card_for_eval(card: Path) -> bytes | None:
    """A router card's bytes as a fingerprint reads them: without its `agent` section; None when it has none (the
    file's bytes count as they are, so cards written before the section existed keep their fingerprints)."""
    try:
        data = json.loads(card.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "agent" not in data:
        return None
    data.pop("agent")
    return (json.dumps(data, indent=1) + "\n").encode()


def _files_stamp(path: Path) -> str:
    """Hash of the files at `path` (a file or a folder): their names and contents.

    Contents, not modification times: a `git checkout` or a copy puts the same adapter back with a new mtime, and that
    used to send 9-minute scoreboard methods back to be recomputed. Files over `CONTENT_HASH_BYTES` (a large model's
    weight shards) count by size and mtime, so a fingerprint never reads gigabytes. A folder's Markdown files are
    left out: editing a model card changes no prediction. So is the `agent` section of a router card
    (`kbrouter_router.json`): what demo/ask/run default to, which eval, with its own agent settings, never reads.
    """
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.suffix != ".md")
    h = hashlib.sha256()
    for p in files:
        if p.name == ROUTER_CARD and (card := _router_card_for_eval(p)) is not None:
            h.update(f"{p.relative_to(path) if p != path else p.name}\0{len(card)}\0".encode() + card)
            continue
        st = p.stat()
        h.update(f"{p.relative_to(path) if p != path else p.name}\0{st.st_size}\0".encode())
        if st.st_size > CONTENT_HASH_BYTES:
            h.update(str(st.st_mtime_ns).encode())
            continue
        with p.open("rb") as f:
            for block in iter(lambda: f.read(2**20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def load_eval_config(path: str | Path, overrides: list[str] = (), values: list[tuple] = ()) -> EvalConfig:
    """Read an eval YAML and apply `--key value` overrides (dots reach nested keys: `--agent.max_steps 2`), then the
    typed `(dotted key, value)` pairs of `values` (CLI flags), through `retrievers.config_file` (its YAML dialect; an
    old-style `key=value` override is an error giving the new form).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown key (named, with the file) or an invalid value.
    """
    data = read_config(EvalConfig, path, list(overrides), values=values, skip=("source_file",), what="eval config")
    try:
        return EvalConfig(**data, source_file=str(path))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from e
