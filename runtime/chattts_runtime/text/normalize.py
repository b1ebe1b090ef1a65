"""Text normalization before tokenization, with the behaviour of upstream ChatTTS's default.

Upstream's ``Chat.infer()`` (``do_text_normalization=True, do_homophone_replacement=True``)
runs, per piece of text, these stages; each is a function here so it can be tested alone:

1. :func:`detect_language`: ``zh`` when the text has more CJK characters than English
   words, else ``en``.
2. an optional language normalizer (numbers, dates... spelled out). Upstream registers
   none by default; its examples register WeTextProcessing (zh) and nemo_text_processing (en).
   Here (:mod:`chattts_runtime.text.language`) each one that is installed is used by default
   (``text.language_normalizers: installed``; the runtime image carries both), so digits,
   dates and amounts are spoken rather than dropped by stage 6.
3. :func:`to_fullwidth` (zh only): ASCII punctuation to its full-width form.
4. :func:`simplify_punctuation`: punctuation the model was not trained on mapped to a
   comma or a full stop (``!`` -> ``.``, ``:`` ``;`` ``(`` ``)`` ``-`` -> ``,``...).
5. :func:`replace_homophones`: rare Chinese characters the model misreads replaced by a
   common homophone. The table is data, read at run time from a file the user already
   has (see :func:`find_homophones_map`); with none present this stage is skipped.
6. :func:`drop_unsupported`: outside bracketed control tags (``[uv_break]``), every
   character other than CJK ideographs (U+4E00..U+9FFF), ASCII letters, ``，。、,.`` and
   space is dropped: digits, ``?``, quotes, emoji... Upstream's set is fixed and does
   not depend on the tokenizer's vocabulary (the real vocabulary does hold digits);
   characters inside the set that the vocabulary lacks become ``[UNK]`` as upstream.
   :func:`drop_unknown` (opt-in) drops those too, using the checkpoint's vocabulary.

One deliberate difference: an unclosed ``[`` (no ``]`` before the next ``[`` or the end) is plain
text here (then dropped as an unsupported character); upstream silently loses what follows it, up
to the next ``[``.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal

log = logging.getLogger(__name__)

Language = Literal["zh", "en"]

_CJK = re.compile(r"[\u4e00-\u9fff]")
_ENGLISH_WORD = re.compile(r"\b[A-Za-z]+\b")
# A bracketed tag kept verbatim by the filters (upstream: anything from "[" to "]").
_TAG = re.compile(r"\[[^\[\]]*\]")
_UNSUPPORTED = re.compile(r"[^\u4e00-\u9fffA-Za-z，。、,. ]")

_FULLWIDTH = str.maketrans({
    "!": "！", '"': "“", "'": "‘", "#": "＃", "$": "＄", "%": "％", "&": "＆", "(": "（", ")": "）",
    ",": "，", "-": "－", "*": "＊", "+": "＋", ".": "。", "/": "／", ":": "：", ";": "；", "<": "＜",
    "=": "＝", ">": "＞", "?": "？", "@": "＠", "\\": "＼", "^": "＾", "`": "｀", "{": "｛", "|": "｜",
    "}": "｝", "~": "～",
})
_SIMPLER_PUNCTUATION = str.maketrans({
    **dict.fromkeys("：；（）【】『』「」《》－", "，"), "！": "。",
    **dict.fromkeys(":;()<>-", ","), "!": ".",
})


def detect_language(text: str) -> Language:
    return "zh" if len(_CJK.findall(text)) > len(_ENGLISH_WORD.findall(text)) else "en"


def map_outside_tags(text: str, fn: Callable[[str], str]) -> str:
    """Apply ``fn`` to the text between bracketed tags; the tags stay as they are."""
    out, last = [], 0
    for tag in _TAG.finditer(text):
        out += [fn(text[last:tag.start()]), tag.group()]
        last = tag.end()
    out.append(fn(text[last:]))
    return "".join(out)


def to_fullwidth(text: str) -> str:
    return text.translate(_FULLWIDTH)


def simplify_punctuation(text: str) -> str:
    return text.translate(_SIMPLER_PUNCTUATION)


def replace_homophones(text: str, table: dict[int, str]) -> str:
    return text.translate(table)


def drop_unsupported(text: str) -> str:
    return map_outside_tags(text, lambda part: _UNSUPPORTED.sub("", part))


def drop_unknown(text: str, known: Callable[[str], bool]) -> str:
    """Drop characters (outside tags) for which ``known(char)`` is false, e.g. not in the vocabulary."""
    return map_outside_tags(text, lambda part: "".join(c for c in part if c == " " or known(c)))


# -- the homophone table: user data, read at run time ---------------------------------------

HOMOPHONES_FILE = "homophones_map.json"


def find_homophones_map(model_dir: str | Path | None, explicit: str | Path | None = None) -> Path | None:
    """Where the homophone table is: ``explicit``, else ``<model dir>/homophones_map.json`` or
    ``<model dir>/asset/homophones_map.json``, else the one an installed upstream ``chattts``
    package carries (``ChatTTS/res/homophones_map.json``, found without importing it)."""
    if explicit is not None:
        return Path(explicit)
    candidates = []
    if model_dir is not None:
        candidates += [Path(model_dir) / HOMOPHONES_FILE, Path(model_dir) / "asset" / HOMOPHONES_FILE]
    spec = importlib.util.find_spec("ChatTTS")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(loc) / "res" / HOMOPHONES_FILE for loc in spec.submodule_search_locations]
    return next((p for p in candidates if p.is_file()), None)


def load_homophones(path: Path) -> dict[int, str]:
    """``{"字": "自", ...}`` (one character each side) -> a ``str.translate`` table."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) and len(k) == len(v) == 1
                                             for k, v in data.items()):
        raise ValueError(f"{path}: expected a JSON object mapping single characters to single characters")
    return {ord(k): v for k, v in data.items()}


# -- the whole normalizer --------------------------------------------------------------------

@dataclass
class TextNormalizer:
    """The stages above in upstream's order. ``homophones`` None = that stage is skipped."""

    homophones: dict[int, str] | None = None
    language_normalizers: dict[str, Callable[[str], str]] = field(default_factory=dict)
    known_character: Callable[[str], bool] | None = None  # set: drop_unknown runs last
    homophones_source: str | None = None  # the table's file (what /health's upstream_data reports)
    language_normalizer_names: dict[str, str] = field(default_factory=dict)  # language -> wetext / nemo

    def __call__(self, text: str, *, lang: Language | None = None) -> str:
        language = lang or detect_language(text)
        spell_out = self.language_normalizers.get(language)
        if spell_out is not None:
            text = map_outside_tags(text, lambda part: spell_out(part) if part else part)
        if language == "zh":
            text = to_fullwidth(text)
        text = simplify_punctuation(text)
        if self.homophones is not None:
            text = replace_homophones(text, self.homophones)
        text = drop_unsupported(text)
        if self.known_character is not None:
            text = drop_unknown(text, self.known_character)
        return text

    def describe(self) -> dict:
        return {"homophones": self.homophones is not None, "homophones_source": self.homophones_source,
                "language_normalizers": {lang: self.language_normalizer_names.get(lang, "custom")
                                         for lang in sorted(self.language_normalizers)},
                "drop_unknown": self.known_character is not None}


def build_normalizer(model_dir: str | Path | None, *, homophones_map: str | Path | None = None,
                     homophones: bool = True, language_normalizers: Iterable[str] | str = (),
                     known_character: Callable[[str], bool] | None = None,
                     grammar_dir: str | Path | None = None) -> TextNormalizer:
    table, source = None, None
    if homophones:
        path = find_homophones_map(model_dir, homophones_map)
        if path is None:
            log.warning("no %s found (checkpoint dir or an installed chattts package): homophone "
                        "replacement is skipped", HOMOPHONES_FILE)
        else:
            table, source = load_homophones(path), str(path)
            log.info("homophone table: %s (%d characters)", path, len(table))
    from chattts_runtime.text import language  # noqa: PLC0415

    names = language.installed_normalizers() if language_normalizers == language.INSTALLED \
        else list(language_normalizers)
    grammars = language.GRAMMAR_DIR if grammar_dir is None else Path(grammar_dir)
    return TextNormalizer(table, language.load_language_normalizers(names, grammars), known_character, source,
                          {language.NORMALIZER_LANGUAGE[n]: n for n in names})
