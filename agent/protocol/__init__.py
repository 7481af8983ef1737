"""The step format, owned in one place: the prompts (`prompts`), the tags (`tags`: write and parse) and the grammars
that constrain decoding to them (`grammar`), all generated from the configured KB set."""

from agent.protocol.evidence import FOCUS_MODES, check_focus_mode
from agent.protocol.grammar import (
    ANSWER_WORDS,
    STOP_PLAN,
    StepGrammar,
    answer_grammar,
    check_answer_words,
    check_display_name,
    fit_answer,
    fit_plan,
    plan_grammar,
    route_grammar,
    shown_answer_grammars,
    shown_words,
)
from agent.protocol.prompts import (
    DEFAULT_PROMPT,
    FINAL_SYSTEM,
    PLAN_SYSTEM,
    PromptSettings,
    add_evidence_images,
    answer_evidence,
    answer_messages,
    evidence_image_paths,
    final_messages,
    history_lines,
    kb_list,
    plan_kb_list,
    plan_messages,
    render_hits,
    with_format_reminder,
    with_kb_list,
)
from agent.protocol.tags import (
    ANSWER,
    FORMAT_ERRORS,
    NONE_WORDS,
    RET,
    SUB_QUESTION,
    THINK,
    AnswerParse,
    PlanParse,
    format_answer,
    format_plan,
    is_none,
    normalize_kb,
    parse_answer,
    parse_plan,
    ret_choice,
    ret_content,
    ret_prefix,
    ret_span,
    strip_tags,
)

__all__ = [
    "ANSWER", "ANSWER_WORDS", "AnswerParse", "DEFAULT_PROMPT", "FINAL_SYSTEM", "FOCUS_MODES", "FORMAT_ERRORS", "NONE_WORDS", "PLAN_SYSTEM",
    "PlanParse", "PromptSettings", "RET", "STOP_PLAN", "SUB_QUESTION", "StepGrammar", "THINK",
    "add_evidence_images", "answer_evidence", "answer_grammar", "answer_messages", "check_answer_words", "check_display_name", "check_focus_mode", "evidence_image_paths",
    "final_messages", "fit_answer", "fit_plan", "format_answer", "format_plan", "history_lines", "is_none",
    "kb_list", "normalize_kb", "parse_answer", "parse_plan", "plan_grammar", "plan_kb_list", "plan_messages",
    "render_hits", "ret_choice", "ret_content", "ret_prefix", "ret_span", "route_grammar", "shown_answer_grammars", "shown_words", "strip_tags", "with_format_reminder", "with_kb_list",
]  # fmt: skip
