"""Front-end parity: text -> pieces -> prompt token ids, here and in upstream's own code.

Upstream's side is ``Chat.infer`` (its split) with the model part captured, its
``Normalizer`` (with the homophone table its package ships) and its ``Tokenizer`` +
``Speaker.decorate_code_prompts``; ours is ``FrontEnd.pieces``. Both read the runtime's
test tokenizer (``chattts_runtime.testing.write_tokenizer``): upstream's character filter is
a fixed set, so the real vocabulary does not change what is dropped; it only decides which
of the kept characters become [UNK], the same on both sides. The normalized texts are
compared too, so characters the small vocabulary maps to [UNK] are still checked.
"""
from __future__ import annotations

import pytest

from frontend_support import blank, upstream, upstream_pieces_and_texts, upstream_res

from chattts_runtime.model.prompt import PromptTokenizer
from chattts_runtime.testing import write_tokenizer
from chattts_runtime.text.frontend import FrontEnd
from chattts_runtime.text.normalize import TextNormalizer, load_homophones
from chattts_runtime.text.split import FrameBudget

LONG_EN = ("ChatTTS is a text-to-speech model designed for dialogue scenarios such as LLM assistants. "
           "It supports both English and Chinese! It was trained on about 100,000 hours of data; the "
           "open-source version on 40,000 hours. Does it predict prosody (laughter, pauses)? Yes: it "
           "can insert [laugh] and [uv_break] tokens. ") * 3
LONG_ZH = ("ChatTTS是一款强大的对话式文本转语音模型。它有中英混读和多说话人的能力！它的训练数据约十万小时，"
           "开源版本使用了四万小时（含中文与英文）。你觉得怎么样？我觉得很好；真的很好。") * 3

CORPUS = [
    # English
    "Hello! It's 3 o'clock: ok?",
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Wait... what? Really!",
    "Mr. Smith went to Washington. He stayed there.",
    "I'd like a cup of tea, please; with milk (no sugar).",
    "Email me at someone@example.com or call +1-555-0100.",
    "Line one\nLine two\nLine three.",
    "Quotes: \"double\" and 'single' and `back`.",
    "Tabs\tand  double  spaces.",
    "UPPER lower MiXeD",
    "rock-and-roll, state-of-the-art <tags> {braces} ~tilde~",
    # Chinese
    "你好世界",
    "你好，世界。",
    "我们是中文语音合成！你好吗？",
    "今天天气很好：我们去公园吧；好不好！",
    "《红楼梦》是一部小说「很有名」『真的』【注意】",
    "他说：“你好”，我说：‘再见’。",
    "这是一个测试、这是第二个测试。",
    "粡为瀹滆摲",  # characters of upstream's homophone table
    "全角标点！？：；（）－",
    # mixed
    "我喜欢 ChatTTS，它很好用!",
    "Hello 你好, world 世界.",
    "GPU 显存 24 GiB，很大。",
    "中文 English 混合 text 测试 test。",
    # digits
    "1234567890",
    "The year 2024 had 366 days.",
    "价格是 99.5 元，折扣 20%。",
    "Call 911 now",
    # punctuation only and symbols
    "!!! ??? ...",
    "#$%&*+/=@\\^|~",
    "a,b.c!d?e:f;g",
    # emoji and other scripts
    "I love it 😀👍!",
    "你好😊世界🌏",
    "Café naïve résumé",
    "Привет мир, hello",
    "こんにちは世界",
    # control tokens
    "[uv_break]hello[laugh] world[lbreak]",
    "你好[uv_break]世界[laugh]，哈哈[lbreak]",
    "[oral_2][laugh_0][break_4] text after controls",
    "[Stts]injected[spk_emb] prompt[empty_spk] tokens",
    "a [not a tag] b [speed_9] c",
    "[laugh][laugh][uv_break]",
    # long paragraphs
    LONG_EN,
    LONG_ZH,
    LONG_EN + "\n" + LONG_ZH,
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer"
    write_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def upstream_side(tokenizer_dir):
    chattts = upstream()
    from ChatTTS.model.speaker import Speaker
    from ChatTTS.model.tokenizer import Tokenizer

    chat = chattts.Chat()
    tokenizer = Tokenizer(str(tokenizer_dir))

    def ids(text: str) -> list[int]:
        prompt = Speaker.decorate_code_prompts([text], "[speed_5]", None, "speaker")
        input_ids, _, _ = tokenizer.encode(prompt, 4)
        return input_ids[0, :, 0].tolist()

    return chat, ids


@pytest.fixture(scope="module")
def frontend(tokenizer_dir):
    normalizer = TextNormalizer(homophones=load_homophones(upstream_res("homophones_map.json")))
    # A context larger than any corpus text: splitting here is upstream's split alone.
    return FrontEnd(PromptTokenizer(tokenizer_dir), normalizer, FrameBudget(1 << 20, 1 << 20))


def test_corpus_is_large_and_varied():
    assert len(CORPUS) >= 40
    assert any(len(t) > 500 for t in CORPUS)


@pytest.mark.parametrize("text", CORPUS, ids=[f"{i:02d}" for i in range(len(CORPUS))])
def test_pieces_texts_and_token_ids_equal_upstream(text, upstream_side, frontend):
    chat, upstream_ids = upstream_side
    theirs = [t for t in upstream_pieces_and_texts(chat, text) if not blank(t)]
    if not theirs:  # nothing speakable: upstream would synthesize an empty prompt; we refuse (400)
        with pytest.raises(ValueError, match="nothing to synthesize"):
            frontend.pieces(text)
        return
    ours = frontend.pieces(text)
    assert [p.text for p in ours] == theirs
    assert [list(p.prompt.input_ids) for p in ours] == [upstream_ids(t) for t in theirs]


def test_without_normalization_ids_equal_upstreams_raw_prompt(upstream_side, frontend):
    _, upstream_ids = upstream_side
    text = "Hello! It's 3 o'clock: ok?"
    (piece,) = frontend.pieces(text, normalize=False)
    assert list(piece.prompt.input_ids) == upstream_ids(text)


def test_issue_example_normalizes_as_upstream(upstream_side, frontend):
    """The issue's example (26 prompt tokens here before, 22 upstream, with the real vocabulary):
    the same normalized text and ids; with the test vocabulary the counts differ, not the equality."""
    chat, upstream_ids = upstream_side
    text = "Hello! It's 3 o'clock: ok?"
    (normed,) = upstream_pieces_and_texts(chat, text)
    assert normed == "Hello. Its  oclock, ok"
    assert list(frontend.pieces(text)[0].prompt.input_ids) == upstream_ids(normed)


def test_unclosed_bracket_deviation(upstream_side, frontend):
    """Upstream loses everything after an unclosed '['; here it is text, and only '[' is dropped."""
    chat, _ = upstream_side
    text = "keep this [and this too"
    assert upstream_pieces_and_texts(chat, text) == ["keep this "]
    assert frontend.pieces(text)[0].text == "keep this and this too"
