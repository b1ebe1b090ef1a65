"""The text normalizer's stages one by one, then together (upstream parity: tests/parity)."""
from __future__ import annotations

import json

import pytest

from chattts_runtime.text import normalize as tn


def test_detect_language_counts_cjk_characters_against_english_words():
    assert tn.detect_language("你好 world") == "zh"
    assert tn.detect_language("你 hello world") == "en"
    assert tn.detect_language("1234") == "en"


def test_fullwidth_then_simpler_punctuation_map():
    assert tn.to_fullwidth("a,b.c!d?") == "a，b。c！d？"
    assert tn.simplify_punctuation("a:b;c!d(e)f-g<h>") == "a,b,c.d,e,f,g,h,"
    assert tn.simplify_punctuation("《书》！") == "，书，。"


def test_drop_unsupported_keeps_letters_cjk_few_marks_and_tags():
    assert tn.drop_unsupported("It's 3 o'clock? 😀 ok.") == "Its  oclock  ok."
    assert tn.drop_unsupported("你好[uv_break]世界123[laugh]！") == "你好[uv_break]世界[laugh]"
    # Anything bracketed is a tag and kept; an unclosed bracket is text (and dropped).
    assert tn.drop_unsupported("a [not a tag] b") == "a [not a tag] b"
    assert tn.drop_unsupported("a [open b") == "a open b"


def test_map_outside_tags_leaves_tags_alone():
    assert tn.map_outside_tags("ab[x]cd[y]", str.upper) == "AB[x]CD[y]"
    assert tn.map_outside_tags("", str.upper) == ""


def test_drop_unknown_uses_the_callers_vocabulary():
    assert tn.drop_unknown("abc d[uv_break]", lambda c: c in "ac") == "ac [uv_break]"


def test_homophone_table_is_read_from_the_checkpoint_dir(tmp_path):
    (tmp_path / "homophones_map.json").write_text(json.dumps({"粡": "同"}), encoding="utf-8")
    path = tn.find_homophones_map(tmp_path)
    assert path == tmp_path / "homophones_map.json"
    table = tn.load_homophones(path)
    assert tn.replace_homophones("粡学", table) == "同学"


def test_bad_homophone_table_is_refused(tmp_path):
    bad = tmp_path / "homophones_map.json"
    bad.write_text(json.dumps({"ab": "c"}), encoding="utf-8")
    with pytest.raises(ValueError, match="single characters"):
        tn.load_homophones(bad)


def test_normalizer_in_upstream_order():
    norm = tn.TextNormalizer(homophones={ord("粡"): "同"})
    assert norm("Hello! It's 3 o'clock: ok?") == "Hello. Its  oclock, ok"
    # zh: ASCII punctuation goes full-width first, so "!" ends as "。" and "?" is dropped.
    assert norm("粡学们好!吗?") == "同学们好。吗"
    assert norm("你好!", lang="en") == "你好."
    assert norm("[laugh]哈哈[uv_break]") == "[laugh]哈哈[uv_break]"


def test_language_normalizer_runs_between_tags_only():
    norm = tn.TextNormalizer(language_normalizers={"en": lambda t: t.replace("3", "three")})
    assert norm("at 3 [uv_break] 3") == "at three [uv_break] three"


def test_without_a_table_homophones_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(tn.importlib.util, "find_spec", lambda name: None)
    norm = tn.build_normalizer(tmp_path)
    assert norm.describe()["homophones"] is False
    assert norm("粡") == "粡"


def test_language_normalizers_are_optional_extras_named_in_the_error():
    import importlib.util

    from chattts_runtime.text.language import NormalizerUnavailable, load_language_normalizers

    assert load_language_normalizers([]) == {}
    with pytest.raises(NormalizerUnavailable, match="unknown language normalizer"):
        load_language_normalizers(["espeak"])
    if importlib.util.find_spec("tn") is None:
        with pytest.raises(NormalizerUnavailable, match="WeTextProcessing"):
            load_language_normalizers(["wetext"])


def test_installed_normalizers_are_the_default_and_each_installed_one_is_used():
    """text.language_normalizers: installed (default) = each of wetext / nemo whose package is importable;
    an explicit list still fails the start for a missing one."""
    import importlib.util

    from chattts_runtime.config import RuntimeConfig
    from chattts_runtime.text.language import installed_normalizers

    assert RuntimeConfig().text.language_normalizers == "installed"
    present = [name for name, module in (("wetext", "tn"), ("nemo", "nemo_text_processing"))
               if importlib.util.find_spec(module) is not None]
    assert installed_normalizers() == present
    with pytest.raises(ValueError):
        RuntimeConfig.model_validate({"text": {"language_normalizers": "all"}})
    assert RuntimeConfig.model_validate({"text": {"language_normalizers": []}}).text.language_normalizers == []
