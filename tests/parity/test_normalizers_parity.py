"""Numbers, dates and amounts with the language normalizers: the runtime's text and prompt against upstream's.

Upstream side: its ``Normalizer`` with WeTextProcessing (zh) and nemo_text_processing (en) registered as its
examples register them (``tn.chinese.normalizer.Normalizer(remove_interjections=False)``; nemo's
``Normalizer(input_case="cased", lang="en")`` with ``verbose=False, punct_post_process=True``), its split
(``Chat.infer``) and its tokenizer; ours: ``FrontEnd`` with ``text.language_normalizers: installed``, the
default, over the same installed packages (``.venv/normalizers-site``, as the runtime image carries them).
"""
from __future__ import annotations

import sys
from functools import partial

import pytest

from frontend_support import blank, upstream, upstream_pieces_and_texts, upstream_res

from tests.support import normalizers_site

TEXTS = [
    "2024年3月15日下午3:30",
    "价格是¥1,234.50元，折扣20%。",
    "会议在2024-03-15 14:00举行，共有365人参加。",
    "It costs $1,234.50.",
    "The meeting is on March 15, 2024 at 3:30 PM.",
    "I have 3 cats and 12 dogs; call 555-0100.",
    "我有3只猫[uv_break]和12条狗。",
    "Version 2.5 has 10% more speed[laugh] than 2.4",
]


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    site, grammars = normalizers_site()
    if str(site) not in sys.path:
        sys.path.append(str(site))
    chattts = upstream()
    from nemo_text_processing.text_normalization.normalize import Normalizer as EnNormalizer
    from tn.chinese.normalizer import Normalizer as ZhNormalizer

    from ChatTTS.model.speaker import Speaker
    from ChatTTS.model.tokenizer import Tokenizer

    from chattts_runtime.config import RuntimeConfig
    from chattts_runtime.model.prompt import PromptTokenizer
    from chattts_runtime.testing import write_tokenizer
    from chattts_runtime.text.frontend import FrontEnd

    chat = chattts.Chat()
    assert chat.normalizer.register("zh", ZhNormalizer(remove_interjections=False).normalize)
    en = EnNormalizer(input_case="cased", lang="en", cache_dir=str(grammars))
    assert chat.normalizer.register("en", partial(en.normalize, verbose=False, punct_post_process=True))
    tokenizer_dir = tmp_path_factory.mktemp("tok") / "tokenizer"
    write_tokenizer(tokenizer_dir)
    config = RuntimeConfig.model_validate({"model": {"path": str(tmp_path_factory.mktemp("model"))}, "text": {
        "homophones_map": str(upstream_res("homophones_map.json")), "normalizer_grammars": str(grammars)},
        "engine": {"max_model_len": 1 << 20}, "generation": {"max_new_frames": 1 << 20}})
    frontend = FrontEnd.from_config(config, PromptTokenizer(tokenizer_dir))
    assert frontend.normalizer.describe()["language_normalizers"] == {"en": "nemo", "zh": "wetext"}
    theirs = Tokenizer(str(tokenizer_dir))

    def upstream_ids(text: str) -> list[int]:
        input_ids, _, _ = theirs.encode(Speaker.decorate_code_prompts([text], "[speed_5]", None, "spk"), 4)
        return input_ids[0, :, 0].tolist()

    return chat, frontend, upstream_ids


@pytest.mark.parametrize("text", TEXTS, ids=[f"{i:02d}" for i in range(len(TEXTS))])
def test_numbers_dates_and_amounts_are_spoken_as_upstream(text, sides):
    chat, frontend, upstream_ids = sides
    theirs = [t for t in upstream_pieces_and_texts(chat, text) if not blank(t)]
    ours = frontend.pieces(text)
    assert [p.text for p in ours] == theirs
    assert not any(c.isdigit() for t in theirs for c in t)  # spelled out, not dropped
    assert [list(p.prompt.input_ids) for p in ours] == [upstream_ids(t) for t in theirs]


def test_a_date_is_spelled_out_not_dropped(sides):
    _, frontend, _ = sides
    (piece,) = frontend.pieces("2024年3月15日下午3:30")
    assert piece.text.startswith("二零二四年三月十五日下午三点三十分")
    (piece,) = frontend.pieces("It costs $1,234.50.")
    assert "one thousand two hundred and thirty four dollars fifty cents" in piece.text
