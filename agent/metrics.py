"""Answer metrics shared by rewards, synthesis and evaluation: F1-recall, exact match, token F1.

They live in `agent`, below all three users: imports flow one way (`retrievers <- agent <- training | eval |
data_synthesis`), so synthesis cannot take them from `eval`.

Two normalisations live here, on purpose:

- `normalize_answer` is the one SQuAD-style normalisation (lower-case, punctuation removed, articles `a|an|the`
  dropped, whitespace collapsed) behind `exact_match` and `token_f1`.
- `paper_normalize` / `paper_tokens` reproduce the R1-Router release's evaluation code quirk for quirk (VQA-style
  punctuation handling, at most 32 periods removed, number words and 'none' to digits, articles `an|the` only,
  contractions, NLTK word tokenisation), because `f1_recall` must match the paper's numbers exactly
  (`../shared/data/metrics/f1_recall_cases.jsonl`, 870 cases, 1e-9). NLTK itself is not needed: its word tokenizer is
  a fixed list of regular expressions, reproduced in `_nltk_word_tokenize`.

All functions are pure and import nothing heavy.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

# --------------------------------------------------------------------------------------------------------------
# The paper's normalisation (VQA evaluation code, as used by R1-Router src/evaluate.py and the step reward)

_CONTRACTIONS_SRC = (
    "aint ain't|arent aren't|cant can't|couldve could've|couldnt couldn't|couldn'tve couldn't've|"
    "couldnt've couldn't've|didnt didn't|doesnt doesn't|dont don't|hadnt hadn't|hadnt've hadn't've|"
    "hadn'tve hadn't've|hasnt hasn't|havent haven't|hed he'd|hed've he'd've|he'dve he'd've|hes he's|howd how'd|"
    "howll how'll|hows how's|Id've I'd've|I'dve I'd've|Im I'm|Ive I've|isnt isn't|itd it'd|itd've it'd've|"
    "it'dve it'd've|itll it'll|let's let's|maam ma'am|mightnt mightn't|mightnt've mightn't've|"
    "mightn'tve mightn't've|mightve might've|mustnt mustn't|mustve must've|neednt needn't|notve not've|"
    "oclock o'clock|oughtnt oughtn't|ow's'at 'ow's'at|'ows'at 'ow's'at|'ow'sat 'ow's'at|shant shan't|"
    "shed've she'd've|she'dve she'd've|she's she's|shouldve should've|shouldnt shouldn't|"
    "shouldnt've shouldn't've|shouldn'tve shouldn't've|somebody'd somebodyd|somebodyd've somebody'd've|"
    "somebody'dve somebody'd've|somebodyll somebody'll|somebodys somebody's|someoned someone'd|"
    "someoned've someone'd've|someone'dve someone'd've|someonell someone'll|someones someone's|"
    "somethingd something'd|somethingd've something'd've|something'dve something'd've|somethingll something'll|"
    "thats that's|thered there'd|thered've there'd've|there'dve there'd've|therere there're|theres there's|"
    "theyd they'd|theyd've they'd've|they'dve they'd've|theyll they'll|theyre they're|theyve they've|"
    "twas 'twas|wasnt wasn't|wed've we'd've|we'dve we'd've|weve we've|werent weren't|whatll what'll|"
    "whatre what're|whats what's|whatve what've|whens when's|whered where'd|wheres where's|whereve where've|"
    "whod who'd|whod've who'd've|who'dve who'd've|wholl who'll|whos who's|whove who've|whyll why'll|"
    "whyre why're|whys why's|wont won't|wouldve would've|wouldnt wouldn't|wouldnt've wouldn't've|"
    "wouldn'tve wouldn't've|yall y'all|yall'll y'all'll|y'allll y'all'll|yall'd've y'all'd've|"
    "y'alld've y'all'd've|y'all'dve y'all'd've|youd you'd|youd've you'd've|you'dve you'd've|youll you'll|"
    "youre you're|youve you've"
)
_CONTRACTIONS = dict(pair.split(" ") for pair in _CONTRACTIONS_SRC.split("|"))
_NUMBER_WORDS = {
    "none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
    "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10",
}  # fmt: skip
_PAPER_ARTICLES = frozenset({"an", "the"})  # the release drops 'an' and 'the' but keeps 'a'
_PUNCT = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"]
_COMMA_STRIP = re.compile(r"(\d)(,)(\d)")
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")  # the release's (broken) look-behind, kept verbatim
_TOKEN_DROP = ",.?!:;'\""  # a token that is a substring of this string is dropped


def _process_punctuation(text: str) -> str:
    out = text
    for p in _PUNCT:
        if (p + " " in text or " " + p in text) or _COMMA_STRIP.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    # The release passes re.UNICODE (== 32) as `count`, so at most 32 periods are removed.
    return _PERIOD_STRIP.sub("", out, count=int(re.UNICODE))


def _process_digit_article(text: str) -> str:
    words = [_NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    words = [w for w in words if w not in _PAPER_ARTICLES]
    return " ".join(_CONTRACTIONS.get(w, w) for w in words)


def paper_normalize(text: str) -> str:
    """Normalise a prediction or gold exactly as the R1-Router release does before tokenising."""
    text = text.replace("\n", " ").replace("\t", " ").strip()
    return _process_digit_article(_process_punctuation(text))


# NLTK 3.9 `word_tokenize(text, preserve_line=True)`, i.e. NLTKWordTokenizer without PTB bracket conversion.
_STARTING_QUOTES = [
    (re.compile("([«“‘„]|[`]+)"), r" \1 "),
    (re.compile(r"^\""), r"``"),
    (re.compile(r"(``)"), r" \1 "),
    (re.compile(r"([ \(\[{<])(\"|\'{2})"), r"\1 `` "),
    (re.compile(r"(?i)(?<!\w)(\')(?!(?:re|ve|ll|m|t|s|d|n)\b)(?=\w)"), r"\1 "),
]
_ENDING_QUOTES = [
    (re.compile("([»”’])"), r" \1 "),
    (re.compile(r"''"), " '' "),
    (re.compile(r'"'), " '' "),
    (re.compile(r"\s+"), " "),
    (re.compile(r"([^' ])('[sS]|'[mM]|'[dD]|') "), r"\1 \2 "),
    (re.compile(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) "), r"\1 \2 "),
]
_PUNCTUATION = [
    (re.compile(r'([^\.])(\.)([\]\)}>"\'' "»”’ " r"]*)\s*$"), r"\1 \2 \3 "),
    (re.compile(r"([:,])([^\d])"), r" \1 \2"),
    (re.compile(r"([:,])$"), r" \1 "),
    (re.compile(r"\.{2,}"), r" \g<0> "),
    (re.compile(r"[;@#$%&]"), r" \g<0> "),
    (re.compile(r"[\u2012-\u2015]"), r" \g<0> "),  # figure/en/em dashes, horizontal bar (NLTK >= 3.9)
    (re.compile(r'([^\.])(\.)([\]\)}>"\']*)\s*$'), r"\1 \2\3 "),
    (re.compile(r"[?!]"), r" \g<0> "),
    (re.compile(r"([^'])' "), r"\1 ' "),
    (re.compile(r"[*]"), r" \g<0> "),
]
_PARENS = (re.compile(r"[\]\[\(\)\{\}\<\>]"), r" \g<0> ")
_DOUBLE_DASH = (re.compile(r"--"), r" -- ")
_CONTRACTIONS2 = [
    re.compile(p)
    for p in (
        r"(?i)\b(can)(?#X)(not)\b", r"(?i)\b(d)(?#X)('ye)\b", r"(?i)\b(gim)(?#X)(me)\b", r"(?i)\b(gon)(?#X)(na)\b",
        r"(?i)\b(got)(?#X)(ta)\b", r"(?i)\b(lem)(?#X)(me)\b", r"(?i)\b(more)(?#X)('n)\b", r"(?i)\b(wan)(?#X)(na)(?=\s)",
    )
]  # fmt: skip
_CONTRACTIONS3 = [re.compile(r"(?i) ('t)(?#X)(is)\b"), re.compile(r"(?i) ('t)(?#X)(was)\b")]


def _nltk_word_tokenize(text: str) -> list[str]:
    for regexp, sub in _STARTING_QUOTES:
        text = regexp.sub(sub, text)
    for regexp, sub in _PUNCTUATION:
        text = regexp.sub(sub, text)
    text = _PARENS[0].sub(_PARENS[1], text)
    text = _DOUBLE_DASH[0].sub(_DOUBLE_DASH[1], text)
    text = " " + text + " "
    for regexp, sub in _ENDING_QUOTES:
        text = regexp.sub(sub, text)
    for regexp in _CONTRACTIONS2 + _CONTRACTIONS3:
        text = regexp.sub(r" \1 \2 ", text)
    return text.split()


def paper_tokens(text: str) -> list[str]:
    """The tokens the R1-Router release counts: normalised, NLTK-tokenised, lone punctuation dropped."""
    return [t for t in _nltk_word_tokenize(paper_normalize(text).lower()) if t not in _TOKEN_DROP]


@dataclass(frozen=True)
class PRF:
    """Token precision, recall and F1 of one prediction against its best gold."""

    precision: float
    recall: float
    f1: float


def _prf(pred_tokens: Sequence[str], gold_tokens: Sequence[str]) -> PRF:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return PRF(0.0, 0.0, 0.0)
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return PRF(precision, recall, (2 * precision * recall) / (precision + recall))


def f1_recall(prediction: str, golds: Sequence[str] | str) -> PRF:
    """Precision, recall and F1 of the best gold, exactly as the paper's released code computes them.

    Among the golds, the one with the highest F1 wins (strictly greater, starting from 0); F1-recall, the paper's
    headline metric, is its `.recall`. An empty prediction, no golds or no overlap scores 0.

    Example:
        >>> f1_recall("the answer is Kathryn Thomas", ["Kathryn Thomas"]).recall
        1.0
    """
    if isinstance(golds, str):
        golds = [golds]
    pred = paper_tokens(prediction) if prediction else []
    best = PRF(0.0, 0.0, 0.0)
    if not pred:
        return best
    for gold in golds:
        score = _prf(pred, paper_tokens(str(gold)))
        if score.f1 > best.f1:
            best = score
    return best


# --------------------------------------------------------------------------------------------------------------
# SQuAD-style EM / token F1 (reported beside F1-recall, which alone rewards verbose answers)

_SQUAD_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SQUAD_PUNCT = frozenset(string.punctuation)


def is_correct(recall: float) -> bool:
    """The one accuracy rule: an answer is right when its F1-recall of the best gold is 1.

    Eval's `answer/acc` (open questions), the answer reward's `accuracy` rule and synthesis' acceptance all use it.
    """
    return recall == 1.0


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _SQUAD_PUNCT)
    return " ".join(_SQUAD_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golds: Sequence[str] | str) -> float:
    """1.0 when the normalised prediction equals any normalised gold, else 0.0."""
    if isinstance(golds, str):
        golds = [golds]
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(str(g)) for g in golds))


def shows_answer(text: str, golds: Sequence[str] | str) -> bool:
    """Whether `text` holds a gold answer as whole words, both normalised: evidence a reader could answer from."""
    if isinstance(golds, str):
        golds = [golds]
    words = f" {normalize_answer(text)} "
    return any(g and f" {g} " in words for g in map(normalize_answer, map(str, golds)))


def token_f1(prediction: str, golds: Sequence[str] | str) -> float:
    """SQuAD token F1 against the best gold (max over golds); 0.0 when nothing overlaps."""
    if isinstance(golds, str):
        golds = [golds]
    pred = normalize_answer(prediction).split()
    return max((_prf(pred, normalize_answer(str(g)).split()).f1 for g in golds), default=0.0)


# --------------------------------------------------------------------------------------------------------------
# InfoSeek numeric golds


def expand_infoseek_golds(answer_eval: Sequence[str | dict]) -> list[str]:
    """InfoSeek `answer_eval` as a list of gold strings, expanding a numeric range as the paper's code does.

    A numeric gold is `[{"wikidata": x, "range": [lo, hi]}]`: the candidates are `str(round(v, 3))` for `v` in
    `numpy.arange(lo, hi + step, step)`, with step 1, 0.1, 0.01 or 0.001 for a width of >= 50, >= 5, >= 1 or less,
    followed by every integer in `[int(lo), int(hi)]`. String golds are returned unchanged.

    Example:
        >>> expand_infoseek_golds([{"wikidata": 2.0, "range": [1.9, 2.1]}])[:3]
        ['1.9', '1.901', '1.902']
    """
    if not answer_eval or not isinstance(answer_eval[0], dict):
        return [str(a) for a in answer_eval]
    import numpy as np  # the release uses numpy.arange; its float steps (start + i * delta) are reproduced exactly

    lo, hi = answer_eval[0]["range"]
    width = hi - lo
    step = 1 if width >= 50 else 0.1 if width >= 5 else 0.01 if width >= 1 else 0.001
    golds = [str(round(float(v), 3)) for v in np.arange(lo, hi + step, step)]
    golds += [str(i) for i in range(int(lo), int(hi) + 1)]
    return golds
