"""Optional language normalizers (numbers, dates, units spelled out), as upstream ChatTTS
suggests registering them: WeTextProcessing for Chinese, nemo_text_processing for English.

Both are maintained libraries installed as extras (``pip install chattts-operator[text-zh]``
/ ``[text-en]``); this module only adapts their call to ``str -> str``. Asking for one that
is not installed is a configuration error, raised at start-up.
"""
from __future__ import annotations

from typing import Callable, Iterable

NORMALIZER_LANGUAGE = {"wetext": "zh", "nemo": "en"}


class NormalizerUnavailable(RuntimeError):
    pass


def _wetext() -> Callable[[str], str]:
    try:
        from tn.chinese.normalizer import Normalizer  # noqa: PLC0415  (WeTextProcessing)
    except ImportError as err:
        raise NormalizerUnavailable("text.language_normalizers has 'wetext' but WeTextProcessing is not "
                                    "installed (pip install WeTextProcessing)") from err
    return Normalizer(remove_interjections=False).normalize


def _nemo() -> Callable[[str], str]:
    try:
        from nemo_text_processing.text_normalization.normalize import Normalizer  # noqa: PLC0415
    except ImportError as err:
        raise NormalizerUnavailable("text.language_normalizers has 'nemo' but nemo_text_processing is not "
                                    "installed (pip install nemo_text_processing)") from err
    normalizer = Normalizer(input_case="cased", lang="en")
    return lambda text: normalizer.normalize(text, verbose=False, punct_post_process=True)


_LOADERS = {"wetext": _wetext, "nemo": _nemo}


def load_language_normalizers(names: Iterable[str]) -> dict[str, Callable[[str], str]]:
    """Names (``wetext``, ``nemo``) -> ``{language: normalize}``."""
    out: dict[str, Callable[[str], str]] = {}
    for name in names:
        if name not in _LOADERS:
            raise NormalizerUnavailable(f"unknown language normalizer {name!r}; use one of {sorted(_LOADERS)}")
        out[NORMALIZER_LANGUAGE[name]] = _LOADERS[name]()
    return out
