"""Prompts for every text a user writes: the runtime's against upstream's own code, id for id.

Classes (issue 33's corpus, written here): control tokens in every position of a text (first, last,
mid-word, doubled, nested, unknown ones), stray and nested brackets, long runs without a sentence end,
blank lines, emoji, markdown, URLs, numbers, dates and money in two languages, classical poetry with rare
characters. Each text's pieces and normalized texts are compared with ``Chat.infer``'s split and
``Normalizer`` (``test_frontend_parity.py``'s way), and every prompt upstream builds from them:

- the code prompt (``Speaker.decorate_code_prompts`` + ``Tokenizer.encode``), with and without a speaker;
- the first piece's text beside the voice sample (``txt_smp``, as ``Chat._infer`` puts the first piece there);
- the refine prompt (``decorate_text_prompts``), control levels included;
- refined text that begins with control tokens (``Chat._infer``: ``ids < [break_0]`` decoded): its code
  prompt, its voice-sample prompt, and which positions carry the speaker (``Speaker.apply``).

Each with the runtime's test tokenizer and with one in the official vocabulary's order (text first, control
levels from ``[break_0]`` on: ``chattts_runtime.testing._vocab``).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from frontend_support import blank, upstream, upstream_pieces_and_texts, upstream_res

from chattts_runtime.model.prompt import PromptTokenizer
from chattts_runtime.model.refine import refine_prompt
from chattts_runtime.testing import write_tokenizer
from chattts_runtime.text.frontend import FrontEnd
from chattts_runtime.text.normalize import TextNormalizer, load_homophones
from chattts_runtime.text.split import FrameBudget

CONTROLS = ["[Stts]", "[Ptts]", "[spk_emb]", "[empty_spk]", "[Sbreak]", "[Pbreak]", "[Ebreak]", "[uv_break]",
            "[laugh]", "[lbreak]", "[speed_2]", "[break_3]", "[oral_5]", "[laugh_1]"]
CORPUS = [
    *(f"{c}你好世界" for c in CONTROLS),  # first
    *(f"hello world{c}" for c in CONTROLS),  # last
    *(f"hel{c}lo 我们{c}是" for c in CONTROLS),  # mid-word, twice
    "[Stts][Stts][spk_emb][spk_emb]你好[Ptts][Ptts]",
    "[spk_[empty_spk]emb]nested speaker",  # upstream's removals in order leave a [spk_emb]
    "[St[spk_emb]ts]你好[empty_[Stts]spk]",
    "[Sbreak]hello[Pbreak][oral_2][Ebreak] world",
    "[unknown_tag] and [ ] and [] and [[laugh]] and ]] stray [",
    "a [not a tag] b [laugh c",
    "((nested (brackets))) 【中文】[括号]",
    "  leading and trailing spaces  ",
    "line one\n\n\nline three\n\n",
    "\n\n",
    "   \t  ",
    "**bold** _italic_ `code` # heading\n- item one\n- item two",
    "see https://example.com/path?q=1&x=2 or www.example.org",
    "2024年3月15日下午3:30，价格是¥1,234.50元",
    "The meeting is on March 15, 2024 at 3:30 PM and costs $1,234.50.",
    "床前明月光，疑是地上霜。举头望明月，低头思故乡。",
    "粡为瀹滆摲，犇羴鱻",  # rare characters (upstream's homophone table)
    "我们是中文语音合成" * 20 + "，" + "你好世界" * 10,  # a long run, one comma
    "我们去公园，你好世界，我们是中文语音合成，今天天气很好，" * 8,  # a long comma-separated sentence
    "word " * 120,  # a long English run without a sentence end
    "emoji 😀 in 你好🌏 text ✨[laugh]✨",
]

# A context larger than any corpus text: the pieces here are upstream's split alone (test_split covers the cut).
BIG = 1 << 20


@pytest.fixture(scope="module", params=["test-order", "official-order"])
def tokenizer_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "tokenizer"
    write_tokenizer(path, official_order=request.param == "official-order")
    return path


@pytest.fixture(scope="module")
def sides(tokenizer_dir):
    chattts = upstream()
    from ChatTTS.model.speaker import Speaker
    from ChatTTS.model.tokenizer import Tokenizer

    theirs = Tokenizer(str(tokenizer_dir))
    ours = PromptTokenizer(tokenizer_dir)
    frontend = FrontEnd(ours, TextNormalizer(homophones=load_homophones(upstream_res("homophones_map.json"))),
                        FrameBudget(BIG, BIG))
    return chattts.Chat(), Speaker, theirs, ours, frontend


def unclosed_bracket(text: str) -> bool:
    """A "[" not closed by a "]" before the next "[" or the end (upstream's tag split loses text there)."""
    depth_open = False
    for c in text:
        if c == "[":
            if depth_open:
                return True
            depth_open = True
        elif c == "]":
            depth_open = False
    return depth_open


def upstream_ids(theirs, prompts: list[str]) -> list[int]:
    input_ids, _, _ = theirs.encode(prompts, 4)
    return input_ids[0, :, 0].tolist()


def test_corpus_has_every_class():
    assert len(CORPUS) >= 60
    assert all(any(c in t for t in CORPUS) for c in CONTROLS)
    assert any(len(t) > 200 and "。" not in t for t in CORPUS)


@pytest.mark.parametrize("text", CORPUS, ids=[f"{i:02d}" for i in range(len(CORPUS))])
def test_code_refine_and_sample_prompts_equal_upstream(text, sides):
    chat, Speaker, theirs, ours, frontend = sides
    pieces = [t for t in upstream_pieces_and_texts(chat, text) if not blank(t)]
    if not pieces:
        with pytest.raises(ValueError, match="nothing to synthesize"):
            frontend.pieces(text)
        return
    planned = frontend.pieces(text)
    if unclosed_bracket(text):
        # The runtime's one deliberate difference (README): a "[" that a "]" does not close before the next "["
        # is text here (then dropped); upstream loses what follows it up to the next "[". Prompts built from
        # upstream's own normalized text are still compared below.
        assert len("".join(p.text for p in planned)) >= len("".join(pieces))
    else:
        assert [p.text for p in planned] == pieces
        for piece, mine in zip(pieces, planned):
            assert list(mine.prompt.input_ids) == list(ours.build(piece, with_speaker=True).input_ids)
    first = pieces[0]
    for piece in pieces:
        for speaker in ("spk", None):
            assert list(ours.build(piece, with_speaker=speaker is not None).input_ids) == upstream_ids(
                theirs, Speaker.decorate_code_prompts([piece], "[speed_5]", None, speaker))
            # the first piece's text beside the voice sample, as upstream's long input puts it
            assert list(ours.build(piece, with_speaker=speaker is not None, sample_text=first).input_ids) == \
                upstream_ids(theirs, Speaker.decorate_code_prompts([piece], "[speed_5]", first, speaker))
        for controls in ("", "[oral_2][laugh_0][break_6]"):
            assert ours.encode(refine_prompt(piece, controls)) == upstream_ids(
                theirs, Speaker.decorate_text_prompts([piece], controls))
    # the text exactly as sent (normalize: false) too
    raw = text if not blank(text) else None
    if raw is not None:
        assert list(ours.build(raw, with_speaker=True).input_ids) == upstream_ids(
            theirs, Speaker.decorate_code_prompts([raw], "[speed_5]", None, "spk"))


REFINED = [
    ["[Stts]", "[spk_emb]", "你", "好"],  # upstream's issue 459: refined text beginning with control tokens
    ["[spk_emb]", "[uv_break]", "h", "i", "[laugh]"],
    ["[empty_spk]", "[Ptts]", "我", "[lbreak]"],
    ["[Stts]", "[Stts]", "[spk_emb]", "[spk_emb]", "[break_2]", "世", "界", "[oral_3]"],
]


@pytest.mark.parametrize("tokens", REFINED, ids=[f"r{i}" for i in range(len(REFINED))])
def test_refined_text_with_control_tokens_prompts_as_upstream(tokens, sides):
    """Refined ids -> the text the audio pass reads -> its prompt, alone and beside the voice sample (where
    upstream keeps the control tokens, so a refined ``[spk_emb]`` there is a second speaker position)."""
    from chattts_runtime.model.refine import refined_text

    _, Speaker, theirs, ours, _ = sides
    vocab = theirs._tokenizer.get_vocab()
    ids = [vocab[t] for t in tokens]
    kept = torch.tensor(ids)
    text = refined_text(ours, ids)
    assert text == theirs.decode([kept[kept.less(theirs.break_0_ids)]])[0]
    for sample in (None, text):
        up = upstream_ids(theirs, Speaker.decorate_code_prompts([text], "[speed_5]", sample, "spk"))
        mine = list(ours.build(text, with_speaker=True, sample_text=sample or "").input_ids)
        assert mine == up
        assert mine.count(ours.spk_emb_id) == up.count(theirs.spk_emb_ids)


def test_every_speaker_position_carries_the_speaker_as_upstreams(upstream):
    """The prompt embedding with the speaker applied, for prompts with one and two ``[spk_emb]`` positions."""
    from chattts_runtime.model.speaker import encode_speaker

    chat, model = upstream.chat, upstream.model
    speaker = encode_speaker(np.random.default_rng(5).normal(0, 1, upstream.cfg.gpt.hidden_size).astype(np.float32))
    for text, sample, positions in (("hello", None, 1), ("hello", "[Stts] [spk_emb] hi", 2),
                                    ("[spk_[empty_spk]emb]hi", None, 2)):
        prompts = chat.speaker.decorate_code_prompts([text], "[speed_5]", sample, speaker)
        input_ids, _, text_mask = chat.tokenizer.encode(prompts, upstream.cfg.gpt.num_vq)
        with torch.inference_mode():
            emb = chat.embed(input_ids, text_mask)
            chat.speaker.apply(emb, speaker, input_ids, chat.tokenizer.spk_emb_ids, torch.device("cpu"))
            ids = model.tokenizer.build(text, with_speaker=True, sample_text=sample or "").input_ids
            ours = model.gpt.prompt_embeds(ids, model.speaker_for(speaker), model.tokenizer.spk_emb_id)
        assert list(ids) == input_ids[0, :, 0].tolist()
        assert int((input_ids[0, :, 0] == chat.tokenizer.spk_emb_ids).sum()) == positions
        # (the speaker rows within the float32-vs-float16 normalisation the runtime README states)
        np.testing.assert_allclose(ours[0].numpy(), emb[0].numpy(), atol=1e-4, rtol=0)


def test_a_piece_that_normalizes_to_nothing_is_dropped_not_synthesized(sides):
    """The one decided difference in the pieces: upstream keeps a piece that normalization empties and
    synthesizes its empty prompt (free babble, up to 2,048 frames, and with it a first-piece voice pass that
    the spoken text alone would not have); here it is dropped (README, "Same as upstream")."""
    chat, _, _, _, frontend = sides
    text = "1234\nhello world"
    assert upstream_pieces_and_texts(chat, text) == ["", "hello world"]
    assert [p.text for p in frontend.pieces(text)] == ["hello world"]
