"""Seeded load traces: request arrival times (non-homogeneous Poisson) and audio lengths."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FRAME_SECONDS = 0.0213  # one ChatTTS code frame is about 21.3 ms of 24 kHz audio


@dataclass(frozen=True)
class Trace:
    name: str
    title: str
    duration: float  # seconds
    rate: np.ndarray  # requests per second, one value per second
    arrivals: np.ndarray  # seconds, sorted
    frames: np.ndarray  # decode steps per request
    # (start, end) seconds when the harness drops every scrape: the autoscalers see nothing new.
    outages: tuple[tuple[float, float], ...] = ()
    # (start, end) seconds when the wait histogram is missing from every scrape (the series
    # dropped, a recording rule broken): the queue gauges and the frame counter still answer.
    wait_outages: tuple[tuple[float, float], ...] = ()


def _arrivals(rate: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    counts = rng.poisson(rate)
    seconds = np.repeat(np.arange(len(rate), dtype=float), counts)
    return np.sort(seconds + rng.random(len(seconds)))


def _frames(count: int, rng: np.random.Generator) -> np.ndarray:
    # Paragraph-length speech: audio length log-normal, median 12 s, clipped to 1-60 s.
    audio = np.clip(rng.lognormal(mean=np.log(12.0), sigma=0.5, size=count), 1.0, 60.0)
    return np.ceil(audio / FRAME_SECONDS)


def _smooth_noise(length: int, rng: np.random.Generator, scale: float, period: int = 300) -> np.ndarray:
    """Multiplicative noise that drifts over minutes (AR(1) per second), mean 1."""
    phi = 1.0 - 1.0 / period
    eps = rng.normal(0.0, scale * np.sqrt(1 - phi * phi), size=length)
    out = np.empty(length)
    value = 0.0
    for i in range(length):
        value = phi * value + eps[i]
        out[i] = value
    return np.exp(out - scale * scale / 2)


def diurnal(seed: int = 1, peak: float = 24.0, rate_scale: float = 1.0) -> Trace:
    """A day: quiet night, morning rise, midday plateau, evening peak, noise that drifts."""
    rng = np.random.default_rng(seed)
    t = np.arange(24 * 3600) / 3600.0
    shape = (
        0.08
        + 0.55 * np.exp(-((t - 10.5) / 2.2) ** 2)
        + 0.45 * np.exp(-((t - 14.5) / 2.5) ** 2)
        + 0.85 * np.exp(-((t - 20.0) / 1.8) ** 2)
    )
    rate = rate_scale * peak * shape / shape.max() * _smooth_noise(len(t), rng, 0.12)
    arrivals = _arrivals(rate, rng)
    return Trace("diurnal", "diurnal day (24 h)", float(len(t)), rate, arrivals, _frames(len(arrivals), rng))


def bursts(seed: int = 2, base: float = 6.0, rate_scale: float = 1.0) -> Trace:
    """Three hours at a steady base with sudden bursts of 2.5-4x lasting 4-15 minutes."""
    rng = np.random.default_rng(seed)
    length = 3 * 3600
    rate = np.full(length, base * rate_scale) * _smooth_noise(length, rng, 0.08)
    start = 600
    while start < length - 900:
        span = int(rng.uniform(240, 900))
        rate[start : start + span] *= rng.uniform(2.5, 4.0)
        start += span + int(rng.uniform(900, 2400))
    arrivals = _arrivals(rate, rng)
    return Trace("bursts", "sudden bursts (3 h)", float(length), rate, arrivals, _frames(len(arrivals), rng))


def ramp(seed: int = 3, low: float = 2.0, high: float = 24.0, rate_scale: float = 1.0) -> Trace:
    """Four hours: a slow ramp from low to high over 2.5 h, a plateau, then back down."""
    rng = np.random.default_rng(seed)
    length = 4 * 3600
    t = np.arange(length, dtype=float)
    up, plateau = 2.5 * 3600, 0.75 * 3600
    shape = np.where(
        t < up, low + (high - low) * t / up,
        np.where(t < up + plateau, high, high - (high - low) * (t - up - plateau) / (length - up - plateau)),
    )
    rate = rate_scale * shape * _smooth_noise(length, rng, 0.06)
    arrivals = _arrivals(rate, rng)
    return Trace("ramp", "slow ramp up and down (4 h)", float(length), rate, arrivals, _frames(len(arrivals), rng))


def _trace(name: str, title: str, rate: np.ndarray, rng: np.random.Generator, **extra) -> Trace:
    arrivals = _arrivals(rate, rng)
    return Trace(name, title, float(len(rate)), rate, arrivals, _frames(len(arrivals), rng), **extra)


def crowd(seed: int = 4, base: float = 1.5, rate_scale: float = 1.0) -> Trace:
    """Two hours at a low base; at 40 min a crowd arrives at 10x within a minute and stays 30 min."""
    rng = np.random.default_rng(seed)
    length = 2 * 3600
    t = np.arange(length, dtype=float)
    lift = np.clip((t - 2400.0) / 60.0, 0.0, 1.0) * (t < 4200.0)
    rate = rate_scale * base * (1.0 + 9.0 * lift) * _smooth_noise(length, rng, 0.05)
    return _trace("crowd", "sudden 10x crowd (2 h)", rate, rng)


def square(seed: int = 5, low: float = 5.0, high: float = 14.0, period: int = 660, rate_scale: float = 1.0) -> Trace:
    """Three hours of a square wave: 5.5 min high, 5.5 min low, just beyond the 300 s
    scale-down stabilization window, the shape that makes a windowed autoscaler follow every edge."""
    rng = np.random.default_rng(seed)
    length = 3 * 3600
    t = np.arange(length)
    rate = rate_scale * np.where((t // (period // 2)) % 2 == 1, high, low) * _smooth_noise(length, rng, 0.05)
    return _trace("square", "square wave, 11 min period (3 h)", rate, rng)


def lull(seed: int = 6, busy: float = 18.0, quiet: float = 2.0, rate_scale: float = 1.0) -> Trace:
    """Four hours: busy, a 40-minute lull at a ninth of the load, then a slow noisy recovery
    over 90 minutes (the shape on which direction reversals pile up)."""
    rng = np.random.default_rng(seed)
    length = 4 * 3600
    t = np.arange(length, dtype=float)
    drop, back, recovered = 3600.0, 3600.0 + 2400.0, 3600.0 + 2400.0 + 5400.0
    shape = np.where(t < drop, busy, np.where(t < back, quiet,
                     np.where(t < recovered, quiet + (busy - quiet) * (t - back) / (recovered - back), busy)))
    rate = rate_scale * shape * _smooth_noise(length, rng, 0.10)
    return _trace("lull", "lull, then slow recovery (4 h)", rate, rng)


def outage(seed: int = 8, base: float = 5.0, rate_scale: float = 1.0) -> Trace:
    """Two hours with two bursts of 3x; the scrapes are dropped for 5 minutes in the middle
    of the second (a Prometheus or network outage): what did the autoscalers do blind?"""
    rng = np.random.default_rng(seed)
    length = 2 * 3600
    rate = np.full(length, base * rate_scale) * _smooth_noise(length, rng, 0.06)
    rate[1200:2100] *= 3.0
    rate[4200:5400] *= 3.0
    return _trace("outage", "burst with a 5 min metrics outage (2 h)", rate, rng, outages=((4500.0, 4800.0),))


def blindburst(seed: int = 9, base: float = 5.0, rate_scale: float = 1.0) -> Trace:
    """Three hours at a noisy base with four bursts (3-4x, 6-12 min), each losing its metric just
    as it begins: the wait histogram vanishes 30 s before the first, at the onset of the second and
    20 s into the fourth (5 min each; the queue gauges still answer); every scrape is dropped from
    the onset of the third for 5 min (nothing answers). Onsets, sizes and gaps were fixed before the
    autoscaler was changed for them."""
    rng = np.random.default_rng(seed)
    length = 3 * 3600
    rate = np.full(length, base * rate_scale) * _smooth_noise(length, rng, 0.08)
    onsets = (1500, 3900, 6300, 8700)
    for onset, span, lift in zip(onsets, (420, 720, 360, 600), (3.0, 4.0, 3.5, 3.0)):
        rate[onset : onset + span] *= lift
    return _trace("blindburst", "bursts, metric lost at each onset (3 h)", rate, rng,
                  wait_outages=((1470.0, 1770.0), (3900.0, 4200.0), (8720.0, 9020.0)),
                  outages=((6300.0, 6600.0),))


def blindcrowd(seed: int = 10, base: float = 1.5, rate_scale: float = 1.0) -> Trace:
    """Two hours at a low base; at 40 min a 10x crowd arrives within a minute and stays 30 min,
    and the wait histogram is lost from 15 s before it for 10 minutes (the queue gauges answer)."""
    rng = np.random.default_rng(seed)
    length = 2 * 3600
    t = np.arange(length, dtype=float)
    lift = np.clip((t - 2400.0) / 60.0, 0.0, 1.0) * (t < 4200.0)
    rate = rate_scale * base * (1.0 + 9.0 * lift) * _smooth_noise(length, rng, 0.05)
    return _trace("blindcrowd", "10x crowd, wait metric lost at its onset (2 h)", rate, rng,
                  wait_outages=((2385.0, 2985.0),))


ALL = (diurnal, bursts, ramp, crowd, square, lull, outage, blindburst, blindcrowd)
