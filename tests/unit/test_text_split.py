"""Cutting long input into pieces that fit the context."""
from __future__ import annotations

import pytest

from chattts_runtime.text.split import FrameBudget, Planner, SentenceTooLong, clauses, sentences, upstream_pieces, words


def test_upstream_cut_at_line_breaks_else_full_stops():
    assert upstream_pieces("a. b。c") == ["a. ", "b。", "c"]
    assert upstream_pieces("a. b\n\nc。d") == ["a. b", "c。d"]
    assert upstream_pieces("  \n") == []


def test_sentences_join_back_to_the_text():
    text = "One! Two? 三。四！五；six... seven.eight"
    parts = sentences(text)
    assert "".join(parts) == text
    assert parts[:5] == ["One!", " Two?", " 三。", "四！", "五；"]


def test_budget_counts_prompt_and_frames():
    budget = FrameBudget(max_model_len=100, max_new_frames=50, frames_per_text_token=2.0)
    assert budget.frames_needed(10) == 20
    assert budget.frames_needed(10, speed=0.5) == 40
    assert budget.fits(prompt_tokens=14, text_tokens=10)
    assert not budget.fits(prompt_tokens=14, text_tokens=30)  # 60 frames > max_new_frames
    assert not budget.fits(prompt_tokens=80, text_tokens=10)  # 80 + 20 reaches max_model_len
    assert budget.max_frames(14) == 50 and budget.max_frames(80) == 19


def _word_planner(limit: int) -> Planner:
    """Pieces are the stripped text; a piece fits with at most ``limit`` words."""
    return Planner(lambda raw: raw.strip() or None, lambda piece: len(piece.split()) <= limit)


def test_pieces_that_fit_are_upstreams_and_long_ones_are_packed_by_sentence():
    planner = _word_planner(4)
    assert planner.plan("a b. c d") == ["a b.", "c d"]
    assert planner.plan("a b! c d? e f g! h") == ["a b! c d?", "e f g! h"]


def test_order_and_every_word_are_kept():
    text = " ".join(f"w{i}." for i in range(50))
    pieces = _word_planner(3).plan(text)
    assert " ".join(pieces).split() == text.split()
    assert all(len(p.split()) <= 3 for p in pieces)


def test_a_sentence_that_cannot_fit_is_cut_at_clauses_then_words():
    """A long comma-separated sentence (no sentence end) is spoken, cut at its commas, then its white space."""
    assert _word_planner(4).plan("x! a b c d e f") == ["x!", "a b c d", "e f"]
    assert _word_planner(3).plan("a b, c d, e f g h i。") == ["a b,", "c d,", "e f g", "h i。"]
    zh = "我们去公园，你好世界，我们是中文语音合成，今天天气很好"
    chars = Planner(lambda raw: raw.strip() or None, lambda piece: len(piece) <= 12)
    pieces = chars.plan(zh)
    assert "".join(pieces) == zh and len(pieces) > 1 and all(len(p) <= 12 for p in pieces)
    assert clauses("a，b、c,d：e") == ["a，", "b、", "c,", "d：", "e"] and words("a b  c") == ["a ", "b  ", "c"]


def test_a_run_without_punctuation_or_space_too_long_is_refused():
    chars = Planner(lambda raw: raw.strip() or None, lambda piece: len(piece) <= 12)
    with pytest.raises(SentenceTooLong, match="13 characters without punctuation"):
        chars.plan("好，" + "你" * 13)


def test_pieces_with_nothing_left_are_dropped():
    planner = Planner(lambda raw: raw.strip(" 1") or None, lambda piece: True)
    assert planner.plan("111\na.\n 1") == ["a."]


def test_a_sentence_beyond_the_cap_but_within_the_context_goes_alone():
    planner = Planner(lambda raw: raw.strip() or None, lambda piece: len(piece.split()) <= 2,
                      lambda piece: len(piece.split()) <= 5)
    assert planner.plan("a b c d! e f") == ["a b c d!", "e f"]
    # beyond the context too: cut at its white space (it has no clause mark) and packed
    assert planner.plan("a b c d e f g!") == ["a b", "c d", "e f", "g!"]
