"""Resident memory and CPU time of a process, from /proc (Linux)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcSample:
    rss_bytes: int
    peak_rss_bytes: int  # VmHWM: the high-water mark since the process started
    cpu_seconds: float   # user + system

    @property
    def rss_mib(self) -> float:
        return self.rss_bytes / 2 ** 20

    @property
    def peak_rss_mib(self) -> float:
        return self.peak_rss_bytes / 2 ** 20


def parse_status(text: str) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes from /proc/<pid>/status."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            number, unit = rest.split()
            assert unit == "kB", unit
            values[key] = int(number) * 1024
    return values["VmRSS"], values["VmHWM"]


def parse_cpu_seconds(stat: str) -> float:
    """utime + stime from /proc/<pid>/stat (fields 14 and 15; the command may hold spaces)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def sample(pid: int) -> ProcSample:
    rss, hwm = parse_status(Path(f"/proc/{pid}/status").read_text())
    cpu = parse_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
    return ProcSample(rss, hwm, cpu)
