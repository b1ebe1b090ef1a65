"""Numbers, dates and amounts spoken through the served API with the normalizers the image carries.

The server runs with ``.venv/normalizers-site`` on its path (WeTextProcessing, nemo_text_processing:
``hack/setup-venv.sh``) and the default config (``text.language_normalizers: installed``). Greedy audio
of a Chinese date and of an English amount equals the audio of their spelled-out text as the libraries
themselves write it (what upstream's examples register; ``tests/parity/test_normalizers_parity.py``
compares the prompts with upstream's), and differs from the audio of the text with its digits dropped
(what a runtime without the normalizers speaks).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from rt_helpers import launch_server, speech, stop_server, tiny_server_config
from chattts_runtime.model.speaker import encode_speaker
from tests.support import normalizers_site

CASES = [
    # (input, lang)
    ("2024年3月15日下午3:30", "zh"),
    ("It costs $1,234.50.", "en"),
]


@pytest.fixture(scope="module")
def spelled(request):
    """Each case's text as the normalizer libraries spell it out (in this process, the same packages)."""
    site, grammars = normalizers_site()
    if str(site) not in sys.path:
        sys.path.append(str(site))
    from nemo_text_processing.text_normalization.normalize import Normalizer as EnNormalizer
    from tn.chinese.normalizer import Normalizer as ZhNormalizer

    zh = ZhNormalizer(remove_interjections=False).normalize
    en = EnNormalizer(input_case="cased", lang="en", cache_dir=str(grammars))
    write = {"zh": zh, "en": lambda t: en.normalize(t, verbose=False, punct_post_process=True)}
    return {text: write[lang](text) for text, lang in CASES}, site, grammars


@pytest.fixture(scope="module")
def server(spelled, endless_checkpoint, tmp_path_factory):
    _, site, grammars = spelled
    config = tiny_server_config(endless_checkpoint, text={"normalizer_grammars": str(grammars)},
                                generation={"max_new_frames": 24})
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(site)]))  # after the code under test
    srv = launch_server(config, tmp_path_factory.mktemp("normalizers"), env_extra={"PYTHONPATH": path})
    yield srv
    stop_server(srv)


def pcm(client, text: str, voice: str) -> np.ndarray:
    r = speech(client, input=text, voice=voice, response_format="pcm", stream=False)
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, np.int16)


@pytest.mark.parametrize("text,lang", CASES, ids=["zh-date", "en-amount"])
def test_a_date_and_an_amount_are_spoken_out(server, spelled, text, lang):
    said = spelled[0][text]
    assert not any(c.isdigit() for c in said)
    voice = encode_speaker(np.random.default_rng(3).standard_normal(64).astype(np.float16))
    with server.client(timeout=300) as c:
        data = c.get("/health").json()["upstream_data"]
        assert data["normalizers"] == {"en": "nemo", "zh": "wetext"}
        assert not [m for m in data["missing"] if m.startswith("normalizer")]
        served = pcm(c, text, voice)
        assert len(served) > 0
        np.testing.assert_array_equal(served, pcm(c, said, voice))
        dropped = "".join(ch for ch in text if not ch.isdigit())
        assert not np.array_equal(served, pcm(c, dropped, voice))
