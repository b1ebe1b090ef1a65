"""Language normalizers (numbers, dates, units, amounts spelled out), registered as upstream
ChatTTS's examples register them: WeTextProcessing for Chinese (``tn.chinese.normalizer``,
``remove_interjections=False``), nemo_text_processing for English (cased, ``punct_post_process``).

Both are maintained libraries (extras ``chattts-operator[text-zh]`` / ``[text-en]``; the runtime
image carries both); this module only adapts their call to ``str -> str``. ``text.language_normalizers``
``installed`` (the default) uses each one that is installed; a list names exactly which, and a
missing one is a configuration error at start-up.

Grammars: WeTextProcessing's wheel ships its compiled FSTs. nemo compiles its English grammars when
its ``Normalizer`` is built (minutes on one core) unless they are cached: :data:`GRAMMAR_DIR` (under the
installation's prefix) is that cache; the image fills it at build time (:func:`build_grammars`), so a
pod loads them instead of compiling. Without it (a venv that never built them) nemo compiles in memory
at start-up, logged.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

log = logging.getLogger(__name__)

GRAMMAR_DIR = Path(sys.prefix) / "share" / "chattts-runtime" / "grammars"

NORMALIZER_LANGUAGE = {"wetext": "zh", "nemo": "en"}


class NormalizerUnavailable(RuntimeError):
    pass


def _wetext(grammar_dir: Path | None) -> Callable[[str], str]:
    try:
        from tn.chinese.normalizer import Normalizer  # noqa: PLC0415  (WeTextProcessing)
    except ImportError as err:
        raise NormalizerUnavailable("text.language_normalizers has 'wetext' but WeTextProcessing is not "
                                    "installed (pip install WeTextProcessing)") from err
    return Normalizer(remove_interjections=False).normalize


def _nemo(grammar_dir: Path | None) -> Callable[[str], str]:
    try:
        from nemo_text_processing.text_normalization.normalize import Normalizer  # noqa: PLC0415
    except ImportError as err:
        raise NormalizerUnavailable("text.language_normalizers has 'nemo' but nemo_text_processing is not "
                                    "installed (pip install nemo_text_processing)") from err
    cache = grammar_dir if grammar_dir is not None and grammar_dir.is_dir() else None
    if cache is None:
        log.info("nemo_text_processing: no grammar cache at %s, compiling its English grammars now", grammar_dir)
    normalizer = Normalizer(input_case="cased", lang="en", cache_dir=None if cache is None else str(cache))
    return lambda text: normalizer.normalize(text, verbose=False, punct_post_process=True)


_LOADERS = {"wetext": _wetext, "nemo": _nemo}


INSTALLED = "installed"


def installed_normalizers() -> list[str]:
    """The names whose package is importable here (found without importing it)."""
    return [name for name, module in (("wetext", "tn"), ("nemo", "nemo_text_processing"))
            if importlib.util.find_spec(module) is not None]


def load_language_normalizers(names: Iterable[str] | str, grammar_dir: Path | None = GRAMMAR_DIR
                              ) -> dict[str, Callable[[str], str]]:
    """Names (``wetext``, ``nemo``), or ``"installed"`` (each one that is installed) -> ``{language: normalize}``."""
    if names == INSTALLED:
        names = installed_normalizers()
    out: dict[str, Callable[[str], str]] = {}
    for name in names:
        if name not in _LOADERS:
            raise NormalizerUnavailable(f"unknown language normalizer {name!r}; use one of {sorted(_LOADERS)}")
        began = time.monotonic()
        out[NORMALIZER_LANGUAGE[name]] = _LOADERS[name](grammar_dir)
        log.info("language normalizer %s (%s) loaded in %.1f s", name, NORMALIZER_LANGUAGE[name],
                 time.monotonic() - began)
    return out


def build_grammars(grammar_dir: Path = GRAMMAR_DIR) -> list[str]:
    """Compile every installed normalizer's grammars into ``grammar_dir`` (the image build runs this), and
    check them on a date and an amount; returns the names built."""
    grammar_dir.mkdir(parents=True, exist_ok=True)
    loaded = load_language_normalizers(INSTALLED, grammar_dir)
    for language, sample in (("zh", "2024年3月15日下午3:30"), ("en", "It costs $1,234.50.")):
        if language in loaded:
            said = loaded[language](sample)
            if any(c.isdigit() for c in said):
                raise RuntimeError(f"the {language} normalizer left digits in {sample!r}: {said!r}")
            print(f"{language}: {sample} -> {said}")
    return installed_normalizers()


if __name__ == "__main__":  # python -m chattts_runtime.text.language [DIR]: the image's build step
    build_grammars(Path(sys.argv[1]) if len(sys.argv) > 1 else GRAMMAR_DIR)
