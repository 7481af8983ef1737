"""Recipe configs for `kbrouter train sft|grpo`: TRL's configs extended by adding fields only (STYLE §15-17).

`StepGRPOConfig(trl.GRPOConfig)` and `StepSFTConfig(trl.SFTConfig)` add the step-data and model fields kbrouter
owns (`StepDataArgs`, a plain field mixin) and, for GRPO, the reward recipe. A YAML file gives the values and
`--key value` flags override them, through TRL's `TrlParser` (`recipe_parser`, `load_config`); an unknown key is an
error naming it. A recipe may start from another with `base: <file>` (`read_recipe`): a variant names only what
it changes.

`rewards` and `lora` stay plain dicts/lists of dicts in the dataclass so TRL can serialise the arguments into
checkpoints; `__post_init__` validates them (unknown reward names, bad weights) before anything loads, and
`reward_specs()` / `lora_config()` return their typed forms.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from trl import GRPOConfig, SFTConfig, TrlParser

from retrievers.config_file import NEW_FORM, check_keys, field_names, read_layered
from retrievers.config_file import yaml_loads as _yaml_load  # the one YAML dialect (`no` a string, `1e-4` a float)
from training.rewards import REWARDS, STEP_TYPES
from training.step_data import FORMATS

logger = logging.getLogger(__name__)

# The paper's reward recipe (DESIGN §7): α = β = 0.5, answer 1.0, format as a gate only (weight 0, still logged).
PAPER_REWARDS = [
    {"name": "ask", "weight": 0.5},
    {"name": "route", "weight": 0.5},
    {"name": "answer", "weight": 1.0},
    {"name": "format", "weight": 0.0},
]


@dataclass(frozen=True)
class RewardSpec:
    """One reward of a recipe: a name from `training.rewards.REWARDS`, its weight and factory kwargs."""

    name: str
    weight: float = 1.0
    kwargs: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> RewardSpec:
        unknown = set(d) - {"name", "weight", "kwargs"}
        if unknown or "name" not in d:
            raise ValueError(f"a reward entry is {{name, weight, kwargs}}; got keys {sorted(d)}")
        if d["name"] not in REWARDS:
            raise ValueError(f"unknown reward {d['name']!r} in `rewards`; valid rewards: {sorted(REWARDS)}")
        weight = d.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:  # NaN fails too
            raise ValueError(
                f"reward {d['name']!r}: `weight` must be a number >= 0, got {weight!r} (a negative weight trains "
                "the policy against the reward); set e.g. `weight: 0.5`, or 0 to log it without training on it"
            )
        if not isinstance(d.get("kwargs") or {}, dict):
            raise ValueError(f"reward {d['name']!r}: `kwargs` must be a mapping, got {d['kwargs']!r}")
        return cls(name=d["name"], weight=float(weight), kwargs=dict(d.get("kwargs") or {}))


@dataclass
class StepDataArgs:
    """Fields shared by the SFT and GRPO recipes: the policy and the step data."""

    model_name_or_path: str = field(
        default="smollm2", metadata={"help": "Policy: local folder, hub name, or `smollm2` (packaged SmolLM2-135M)."}
    )
    model_dtype: str = field(default="float32", metadata={"help": "float32 | bfloat16 | float16 | auto."})
    train_file: str = field(default="", metadata={"help": "Step data JSONL (trajectories, step records or paper)."})
    train_format: str = field(default="auto", metadata={"help": f"One of {FORMATS}."})
    eval_file: str | None = field(default=None, metadata={"help": "Optional held-out step data, same formats."})
    kbs: list[dict] = field(
        default_factory=list,
        metadata={"help": "KBs shown in plan prompts built from trajectories: [{name, description}]."},
    )
    step_types: list[str] | None = field(default=None, metadata={"help": "Keep only these step types, e.g. [plan]."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use the first N step prompts."})
    max_per_step_type: dict | None = field(
        default=None, metadata={"help": "At most N records of each step type, e.g. {plan: 240, final: 80}."}
    )
    max_per_dataset: dict | None = field(
        default=None,
        metadata={
            "help": 'At most N records from each source dataset (`metadata.dataset`), `"*"` for the others, '
            'e.g. {clip_notes: 240, "*": 30}: a focused stage that still replays the rest. Applied per step type; '
            'a mapping caps step types apart, the others uncapped: {"*": {answer: 20}} draws answers evenly.'
        },
    )
    answers_shown: bool = field(
        default=False,
        metadata={
            "help": "Keep only the intermediate-answer records whose evidence shows a gold answer (whole words, "
            "normalised; yes/no golds kept): a reader taught to answer from what it reads, not to guess past the "
            "evidence its rendering cut. Applied before the caps."
        },
    )
    sample_seed: int | None = field(
        default=None, metadata={"help": "Shuffle the records with this seed before the caps (None keeps file order)."}
    )
    balance_plan_decisions: bool = field(
        default=False,
        metadata={
            "help": "Before the caps, order each dataset's plan records so gold stops and gold searches alternate: "
            "a capped sample then holds both decisions about equally (a GRPO sample with 1 stop in 5 taught the "
            "policy never to stop, stop 25)."
        },
    )
    max_prompt_tokens: int | None = field(
        default=None, metadata={"help": "Prompt budget; over-long prompts lose lines or are skipped (step_data.py)."}
    )
    use_images: bool = field(default=False, metadata={"help": "Give the step images to a vision-language policy."})
    image_root: str | None = field(default=None, metadata={"help": "Folder holding the images, found by basename."})
    lora: dict | None = field(
        default=None, metadata={"help": "LoRA through peft: {r, alpha, dropout, target_modules}; None = full FT."}
    )
    grammar_tokens: dict | None = field(
        default=None,
        metadata={
            "help": "{plan, answer, final} token budgets: fit SFT targets to the step grammars the constrained "
            "agent decodes in (agent.plan_tokens, ...); unfit records are skipped and counted."
        },
    )
    init_adapter: str | None = field(
        default=None, metadata={"help": "A peft adapter folder to start from and train further (e.g. SFT -> GRPO)."}
    )
    kb_list_share: float = field(
        default=0.0,
        metadata={
            "help": "Share of plan records re-rendered with a shuffled subset of their KB list, gold KB kept "
            "(training/kb_lists.py), so routing reads the list instead of memorising one layout."
        },
    )
    kb_list_min: int = field(default=2, metadata={"help": "Fewest KBs a re-rendered list keeps."})
    kb_name_share: float = field(
        default=0.0,
        metadata={
            "help": "Share of plan records re-rendered with their KBs under other names, descriptions kept "
            "(training/kb_lists.py), so routing reads the descriptions instead of memorising the names."
        },
    )
    kb_name_aliases: dict | None = field(
        default=None, metadata={"help": "{display name: [other names]}: the names a renamed KB may take."}
    )
    kb_name_opaque: float = field(
        default=0.3, metadata={"help": "Chance that a renamed KB gets an opaque name ('Collection 4') instead."}
    )

    def _check_data_args(self) -> None:
        max_steps = getattr(self, "max_steps", -1)
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or not (max_steps == -1 or max_steps > 0):
            raise ValueError(
                f"`max_steps` must be -1 (train `num_train_epochs` epochs) or > 0, got {max_steps!r} (TRL would take "
                "any other negative value as -1 and train whole epochs); set e.g. `max_steps: 100`"
            )
        if not self.train_file:
            raise ValueError("`train_file` is required: set e.g. `train_file: data/steps.jsonl` in the YAML")
        if self.train_format not in FORMATS:
            raise ValueError(f"`train_format` {self.train_format!r} is not one of {FORMATS}")
        if self.step_types:
            bad = sorted(set(self.step_types) - set(STEP_TYPES))
            if bad:
                raise ValueError(f"`step_types` {bad} unknown; valid: {list(STEP_TYPES)}")
        if self.model_dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(f"`model_dtype` {self.model_dtype!r}: use float32, bfloat16, float16 or auto")
        for kb in self.kbs:
            if set(kb) - {"name", "description"} or "name" not in kb:
                raise ValueError(f"each `kbs` entry is {{name, description}}; got {kb!r}")
        if self.grammar_tokens is not None and set(self.grammar_tokens) != {"plan", "answer", "final"}:
            raise ValueError(
                f"`grammar_tokens` needs exactly the keys plan, answer, final; got {sorted(self.grammar_tokens)}"
            )
        for name, cap in (self.max_per_dataset or {}).items():
            per_type = cap.items() if isinstance(cap, dict) else [(None, cap)]
            for step_type, count in per_type:
                where = f"max_per_dataset.{name}" + (f".{step_type}" if step_type is not None else "")
                if step_type is not None and step_type not in STEP_TYPES:
                    raise ValueError(
                        f"`{where}`: a per-step-type cap names plan, answer or final; e.g. {{answer: 20}}"
                    )
                if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                    raise ValueError(f"`{where}` must be a count >= 0, got {count!r}; e.g. 30")
        if isinstance(self.kb_list_min, bool) or self.kb_list_min < 1:
            raise ValueError(f"`kb_list_min` must be >= 1, got {self.kb_list_min!r}")
        for key in ("kb_list_share", "kb_name_share", "kb_name_opaque"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ValueError(f"`{key}` must be a share in [0, 1], got {value!r}; e.g. 0.5")
        if self.kb_name_aliases is not None:
            from training.kb_lists import check_kb_aliases

            check_kb_aliases(self.kb_name_aliases)
        if self.init_adapter is not None:
            if self.lora is not None:
                raise ValueError("`init_adapter` trains an existing adapter further; drop `lora` (its rank is fixed)")
        if self.lora is not None:
            unknown = set(self.lora) - {"r", "alpha", "dropout", "target_modules"}
            if unknown:
                raise ValueError(f"unknown `lora` keys {sorted(unknown)}; valid: r, alpha, dropout, target_modules")

    def kb_pairs(self) -> list[tuple[str, str]]:
        """`kbs` as `(display_name, description)` pairs for `agent.prompts.plan_messages`."""
        return [(kb["name"], kb.get("description", "")) for kb in self.kbs]

    def lora_config(self):
        """A `peft.LoraConfig` from `lora`, or None for full fine-tuning."""
        if self.lora is None:
            return None
        try:
            from peft import LoraConfig
        except ImportError as e:
            raise ImportError("`lora` needs peft: pip install 'kbrouter[train]'") from e
        return LoraConfig(
            r=int(self.lora.get("r", 16)),
            lora_alpha=int(self.lora.get("alpha", 32)),
            lora_dropout=float(self.lora.get("dropout", 0.05)),
            target_modules=self.lora.get("target_modules", "all-linear"),
            task_type="CAUSAL_LM",
        )


@dataclass
class StepGRPOConfig(GRPOConfig, StepDataArgs):
    """Step-GRPO recipe: TRL's `GRPOConfig` plus step data, the policy and the reward recipe."""

    rewards: list[dict] = field(
        default_factory=lambda: [dict(r) for r in PAPER_REWARDS],
        metadata={"help": f"[{{name, weight, kwargs}}]; names: {sorted(REWARDS)}. Default: the paper's."},
    )
    format_gate: bool = field(
        default=True, metadata={"help": "Malformed tags score 0 on every component (the paper's gate)."}
    )
    online: bool = field(
        default=False,
        metadata={"help": "Online Step-GRPO: live step trees through the KBs, G siblings per visited step "
                          "(training/online_grpo.py); `train_file` then holds questions or gold trajectories."},
    )  # fmt: skip
    online_rollout: dict | None = field(
        default=None,
        metadata={"help": "With `online: true`: {kb, max_steps, top_k, discount, outcome_weight, lookahead, "
                          "allow_outcome_only, ...} (training/rollouts.py, OnlineSettings)."},
    )  # fmt: skip
    constrained_rollouts: bool = field(
        default=False,
        metadata={"help": "Sample every completion under its step grammar (of `grammar_tokens`), as the constrained "
                          "agent decodes: the group's reward differences then come from decisions and answers, not "
                          "tags (training/constrained_rollouts.py). transformers generation only."},
    )  # fmt: skip
    skip_zero_advantage: bool = field(
        default=True,
        metadata={"help": "Leave the rows whose advantage is 0 (groups with equal rewards) out of the loss's forward "
                          "and backward: the same gradient, less compute. Off by itself where such rows still count "
                          "(beta > 0, an entropy term, images, several processes): training/zero_advantage.py."},
    )  # fmt: skip
    screen_prompts: bool = field(
        default=False,
        metadata={"help": "Before training, sample each train prompt's G completions with the starting policy and keep "
                          "only the prompts whose rewards differ (a group with equal rewards has no gradient): DAPO's "
                          "dynamic sampling, done once. Saved as prompt_screen.json; training/prompt_screen.py."},
    )  # fmt: skip
    rollout_min_steps: int = field(
        default=0,
        metadata={"help": "With `constrained_rollouts`: plan rows with `step_index` below N are sampled without the "
                          "stop branch, as the agent decodes them at `agent.min_steps: N` (the shipped default is 1). "
                          "Stop 26: with the branch open, first-step rollouts learnt to stop and the forced first "
                          "search of the agent then went to a wrong KB."},
    )  # fmt: skip

    def _check_online(self) -> None:
        if not self.online:
            raise ValueError("`online_rollout` is set but `online` is false; set `online: true` or drop it")
        self.online_settings()  # unknown keys and bad values fail here
        if self.train_format not in ("auto", "trajectories"):
            raise ValueError(f"online mode reads questions or gold trajectories, not `train_format: "
                             f"{self.train_format}`; set `train_format: auto`")  # fmt: skip
        if self.eval_file:
            raise ValueError("`eval_file` is not used online; drop it (benchmarks/online_vs_offline.py evaluates)")
        if self.screen_prompts:
            raise ValueError("`screen_prompts` screens step prompts by their G-completion groups; an online step tree "
                             "expands each question into rows of many prompts, so it cannot be screened that way. "
                             "Set `screen_prompts: false`, or train on step prompts (`online: false`)")  # fmt: skip
        if self.per_device_train_batch_size % self.num_generations:
            raise ValueError(
                f"online: `per_device_train_batch_size` ({self.per_device_train_batch_size}) must be a multiple of "
                f"`num_generations` ({self.num_generations}) so that each process rolls out whole questions"
            )

    def _check_constrained_rollouts(self) -> None:
        if not self.grammar_tokens:
            raise ValueError("`constrained_rollouts: true` samples under the step grammars of `grammar_tokens`; set "
                             "`grammar_tokens: {plan: 448, answer: 256, final: 256}` (the SFT recipe's)")  # fmt: skip
        if self.online:
            raise ValueError("`constrained_rollouts` is for step prompts; online step trees sample through the agent's "
                             "own rollouts: drop one of `online` and `constrained_rollouts`")  # fmt: skip
        if self.use_vllm:
            raise ValueError("`constrained_rollouts` samples with transformers' generate (one grammar per row), which "
                             "TRL's vLLM path cannot take; set `use_vllm: false` or `constrained_rollouts: false`")  # fmt: skip
        if self.use_images:
            raise ValueError("`constrained_rollouts` supports text step prompts only; set `use_images: false`")

    def online_settings(self):
        """The validated `online_rollout` (a `training.rollouts.OnlineSettings`)."""
        from training.rollouts import OnlineSettings

        return OnlineSettings.from_dict(self.online_rollout)

    def __post_init__(self):
        self._check_data_args()
        if self.num_generations is not None and self.num_generations < 2:
            raise ValueError(
                f"`num_generations` ({self.num_generations}) must be >= 2 for group-relative advantages; "
                "set e.g. `num_generations: 8` in the YAML"
            )
        if self.online or self.online_rollout is not None:
            self._check_online()
        if self.constrained_rollouts:
            self._check_constrained_rollouts()
        steps = self.rollout_min_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"`rollout_min_steps` must be a step count >= 0, got {self.rollout_min_steps!r}; e.g. 1")
        if self.rollout_min_steps and not self.constrained_rollouts:
            raise ValueError("`rollout_min_steps` removes the stop branch from the step grammar, so it needs "
                             "`constrained_rollouts: true`; set that, or drop `rollout_min_steps`")  # fmt: skip
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not self.beta >= 0:
            raise ValueError(
                f"`beta` (the KL coefficient) must be >= 0, got {self.beta!r} (a negative one pushes the policy away "
                "from the reference); set e.g. `beta: 0.04`, or 0 for no KL term"
            )
        for key in ("epsilon", "epsilon_high"):
            value = getattr(self, key, None)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise ValueError(f"`{key}` (the PPO clipping range) must be > 0, got {value!r}; set e.g. `{key}: 0.2`")
        if not isinstance(self.rewards, list):
            raise ValueError(f"`rewards` must be a list of {{name, weight, kwargs}}, got {self.rewards!r}")
        specs = [RewardSpec.from_dict(r) if isinstance(r, dict) else r for r in self.rewards]
        if any(not isinstance(s, RewardSpec) for s in specs):
            raise ValueError(f"each `rewards` entry is a mapping {{name, weight, kwargs}}; got {self.rewards!r}")
        if not specs:
            raise ValueError("`rewards` is empty; list at least one of " + ", ".join(sorted(REWARDS)))
        if all(s.weight == 0 for s in specs) and not (self.online and self.online_settings().outcome_weight > 0):
            raise ValueError("every reward `weight` is 0: nothing would be trained; give at least one a weight > 0")
        if self.reward_weights is not None and list(self.reward_weights) != [s.weight for s in specs]:
            raise ValueError("set reward weights in `rewards: [{name, weight}]`, not in `reward_weights`")
        self.reward_weights = [s.weight for s in specs]
        super().__post_init__()

    def reward_specs(self) -> list[RewardSpec]:
        """The validated reward recipe."""
        return [RewardSpec.from_dict(r) for r in self.rewards]


@dataclass
class StepSFTConfig(SFTConfig, StepDataArgs):
    """SFT recipe on step records: TRL's `SFTConfig` plus step data and the policy."""

    decision_weight: float = field(
        default=1.0,
        metadata={"help": "loss weight of a plan's decision tokens (search-or-stop, the KB name); 1 = plain SFT "
                          "(training/decision_loss.py)"},
    )  # fmt: skip

    def __post_init__(self):
        if not self.decision_weight > 0:
            raise ValueError(f"`decision_weight` must be > 0 (1 = plain SFT); got {self.decision_weight}")
        self._check_data_args()
        super().__post_init__()


CONFIGS = {"grpo": StepGRPOConfig, "sft": StepSFTConfig}
COMMANDS = {cls: command for command, cls in CONFIGS.items()}


def _structured(hint: object) -> bool:
    """Whether a field's annotation holds a list or a mapping (`list[dict]`, `dict | None`, `None | str | list[str]`)."""
    if hint in (list, dict) or typing.get_origin(hint) in (list, dict):
        return True
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and any(map(_structured, typing.get_args(hint)))


def _yaml_value(text: str) -> object:
    """A list or mapping flag's value, read as the YAML of a recipe would be (`[plan]`, `{r: 8}`, `null`)."""
    try:
        return _yaml_load(text)
    except yaml.YAMLError as e:  # argparse reports only ValueError/TypeError/ArgumentTypeError as a bad value
        raise argparse.ArgumentTypeError(f"{text!r} is not YAML ({getattr(e, 'problem', e)})") from None


def _str_or_null(value: str) -> str | None:
    """A `str | None` flag's value: YAML's `null`/`~` is None (as in a recipe), anything else the string as written."""
    return None if value in ("null", "Null", "NULL", "~") else value


def recipe_parser(command: str) -> TrlParser:
    """TRL's parser over the recipe dataclass of `command`: one `--field value` flag per field, TRL's types and help.

    Two kinds of flags read their value as the YAML of a recipe would, since `HfArgumentParser` cannot:
    a field holding a list or a mapping (`--rewards '[{name: answer}]'`, `--lora '{r: 8}'`, `--step_types null`;
    HfArgumentParser makes `list[dict]` a `nargs="+"` of `dict(str)` and `dict` a `dict(str)`, which no string
    parses into) and a `str | None` field given `null` (`--init_adapter null` is None; HfArgumentParser keeps the
    string "null").

    Raises:
        ValueError: an unknown command.
    """
    if command not in CONFIGS:
        raise ValueError(f"unknown command {command!r}; valid: {sorted(CONFIGS)}")
    cls = CONFIGS[command]
    # no prefix matching (`--num_gen 4` is an unknown key, not num_generations); bad values raise instead of exiting
    parser = TrlParser(
        cls,
        prog=f"kbrouter train {command}",
        usage=f"kbrouter train {command} --config FILE [--key value ...]",
        description="`--config FILE` gives the recipe (configs/train/*.yaml); each flag below overrides one key.",
        allow_abbrev=False,
        exit_on_error=False,
    )
    hints = typing.get_type_hints(cls)  # the annotations as written: HfArgumentParser rewrites `Field.type` in place
    for action in parser._actions:  # argparse keeps no public list; TrlParser.set_defaults_with_config walks it too
        hint = hints.get(action.dest)
        if hint is None or action.option_strings[0] != f"--{action.dest}":  # --help, and the `--no_x` complements
            continue
        if _structured(hint):
            action.type, action.nargs = _yaml_value, None
        elif hint == str | None:
            action.type = _str_or_null
    return parser


def _flag_error(unparsed: list[str], cls: type, path: Path | None) -> ValueError:
    """The error for the first flag `recipe_parser` left unparsed: an unknown key (closest keys named) or a stray word."""
    tok = unparsed[0]
    key, eq, raw = tok.removeprefix("--").partition("=")
    if not tok.startswith("--"):
        if eq and re.fullmatch(r"[A-Za-z_][\w.-]*", key):
            return ValueError(f"override {tok!r} is the old `key=value` form; write `--{key} {raw}` ({NEW_FORM})")
        return ValueError(
            f"unexpected argument {tok!r}: a flag takes one value (a list is one YAML value, e.g. "
            f"`--step_types '[plan, final]'`); overrides look like {NEW_FORM}"
        )
    key = key.replace("-", "_")
    close = difflib.get_close_matches(key, field_names(cls), n=3)
    hint = f"; did you mean {close}?" if close else f"; `kbrouter train {COMMANDS[cls]} --help` lists the keys"
    return ValueError(f"unknown key {key!r} in the overrides (recipe {path}){hint}")


def read_recipe(path: str | Path) -> dict:
    """A recipe's values with its `base:` chain applied (`retrievers.config_file.read_layered`); paths stay as written.

    Raises:
        FileNotFoundError: the recipe, or a base it names, does not exist (the message names both files).
        ValueError: not a mapping, `base:` not a file name, or a chain of bases that returns to a recipe in it.
    """
    return read_layered(path, "recipe")


AUTO = "auto"


def _flag_values(tokens: list[str]) -> argparse.Namespace:
    """Every value the overrides give `--bf16` and `--use_cpu`, in order, read by argparse as the recipe parser reads
    them (`--f v`, `--f=v`, `-` for `_`; the parser takes the last, and refuses a bare `--f`); [] where a flag is absent."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--bf16", nargs="?", action="append", default=[])  # `?`: never exits; the parser judges
    parser.add_argument("--use_cpu", "--use-cpu", nargs="?", action="append", default=[])
    return parser.parse_known_args(tokens)[0]


def resolve_auto_bf16(values: dict, tokens: list[str]) -> None:
    """Replace `bf16: auto` (recipe) or `--bf16 auto` (override), in place, by what this machine multiplies fast.

    bf16 autocast where the device has bf16 units (a CUDA GPU that supports it; a CPU with avx512_bf16 or AMX), else
    float32: on a CPU without them bf16 runs ~40x slower (`agent.backends.models.warn_if_slow_bf16`; stop 52 met such
    a CPU), so a recipe written on one CPU would crawl on another. The choice is logged; `true` / `false` stay as given.
    """
    given = _flag_values(tokens)
    if values.get("bf16") != AUTO and AUTO not in given.bf16:
        return
    import torch

    from agent.backends.models import cpu_has_bf16

    use_cpu = given.use_cpu[-1] if given.use_cpu else None
    on_cpu = (values.get("use_cpu") is True if use_cpu is None else str(use_cpu).lower() in ("true", "1", "yes")) or (
        not torch.cuda.is_available()
    )
    fast = cpu_has_bf16() if on_cpu else torch.cuda.is_bf16_supported()
    logger.info(
        "bf16: auto -> %s (%s %s bf16 units)", fast, "this CPU" if on_cpu else "the GPU", "has" if fast else "has no"
    )
    if values.get("bf16") == AUTO:  # a string default would reach argparse's bool type even when overridden
        values["bf16"] = fast
    for i, token in enumerate(tokens):
        if token == f"--bf16={AUTO}":
            tokens[i] = f"--bf16={str(fast).lower()}"
        elif token == "--bf16" and tokens[i + 1 : i + 2] == [AUTO]:
            tokens[i + 1] = str(fast).lower()


def load_config(command: str, path: str | Path | None, overrides: list[str] | None = None):
    """Build the config of `command` (`sft` or `grpo`) from a YAML recipe and `--key value` overrides.

    The recipe (with its `base:` chain, `read_recipe`) is read in the project's YAML dialect
    (`retrievers.config_file.yaml_loads`: only `true`/`false` are booleans, `1e-4` is a float) and its values become
    the defaults of `recipe_parser`'s flags (`TrlParser.set_defaults_with_config`); TRL's `HfArgumentParser` then
    parses the overrides and builds the dataclass, which validates itself. `TrlParser.parse_args_and_config` is not
    called because it reads the file with `yaml.safe_load` (`save_strategy: no` would be False) and exports an `env:`
    section into `os.environ`. Paths are kept as written (relative to the working directory), as before; only `base:`
    is relative to the recipe's folder.

    Raises:
        ValueError: an unknown key (naming it, the file and the closest valid keys), a bad value (naming the flag and
            where it came from), or values the config rejects.
        FileNotFoundError: the recipe, or a base it names, does not exist.
    """
    parser = recipe_parser(command)
    cls = CONFIGS[command]
    values: dict = {}
    tokens = list(overrides or [])
    if path is not None:
        path = Path(path)
        values = read_recipe(path)
        check_keys(cls, values, str(path))  # TRL's own message would name neither the file nor the closest key
    resolve_auto_bf16(values, tokens)
    if values:
        parser.set_defaults_with_config(**values)
    try:
        _, unparsed = parser.parse_known_args(tokens)
        if unparsed:
            raise _flag_error(unparsed, cls, path)
        (cfg,) = parser.parse_args_into_dataclasses(tokens, look_for_args_file=False)  # no hidden `<script>.args`
    except argparse.ArgumentError as e:  # a value its type refuses, e.g. `--num_generations eight` or `bf16: off`
        given = e.argument_name and any(t.split("=")[0] in e.argument_name.split("/") for t in tokens)
        where = "the overrides" if given or path is None else str(path)
        raise ValueError(f"{where}: {e}; give a value of the field's type (`{parser.prog} --help`)") from None
    return cfg
