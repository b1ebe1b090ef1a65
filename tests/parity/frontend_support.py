"""Upstream ChatTTS (``chattts==0.2.5``) for the front-end and speaker parity tests.

The package is a test-time reference only (AGPL-3.0). hack/setup-venv.sh installs it with
its light dependencies into ``.venv/parity-site`` (``CHATTTS_PARITY_SITE`` overrides);
:func:`upstream` puts that folder on ``sys.path`` and imports it. A missing package fails
the test with the install command: the parity tier never skips.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PARITY_SITE = Path(os.environ.get("CHATTTS_PARITY_SITE", REPO / ".venv" / "parity-site"))


def upstream():
    """The imported ``ChatTTS`` package (fails, never skips, when it is not installed)."""
    if PARITY_SITE.is_dir() and str(PARITY_SITE) not in sys.path:
        sys.path.append(str(PARITY_SITE))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module("ChatTTS")
    except ImportError as err:
        pytest.fail(f"upstream ChatTTS is not importable ({err}); run hack/setup-venv.sh "
                    f"(it installs chattts==0.2.5 into {PARITY_SITE})", pytrace=False)


def upstream_res(name: str) -> Path:
    return Path(upstream().__file__).parent / "res" / name


def upstream_pieces_and_texts(chat, text: str) -> list[str]:
    """What upstream's ``Chat.infer`` hands its pipeline: the split pieces, normalized.

    ``_infer`` (the model part) is replaced by a capture; ``refine_text_only=True`` makes
    ``infer`` return what the capture yields.
    """
    captured: list[list[str]] = []

    def capture(pieces, stream, lang, skip_refine, refine_only, use_decoder, do_normalize, do_homophones, *rest):
        captured.append([chat.normalizer(t, do_normalize, do_homophones, lang) for t in pieces])
        yield captured[-1]

    chat._infer = capture
    chat.infer(text, refine_text_only=True)
    return captured[0]


def blank(text: str) -> bool:
    return not re.sub(r"\s", "", text)
