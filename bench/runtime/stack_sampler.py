"""Where a process's Python threads spend their time, sampled, for GPU runs without py-spy.

The GPU machine has no profiler that reads another process's Python stacks, and vLLM runs its
engine core in a process of its own. Started in every process of a benchmark (through
``bench/runtime/stack_hook/sitecustomize.py`` when ``STACK_SAMPLES_DIR`` is set), a daemon thread
reads ``sys._current_frames()`` every ``STACK_SAMPLES_INTERVAL_S`` (default 2 ms) and counts each
thread's stack. Every few seconds, and at exit, it rewrites ``<dir>/stacks-<role>-<pid>.txt``:
per thread, the functions with the most samples on the stack (inclusive) and on top of it (self),
then the folded stacks (``frame;frame;frame count``, a flame graph's input).

A sample holds the GIL for the walk (tens of microseconds), so the sampled program runs a few
per cent slower: read the shares, not the absolute times.
"""
from __future__ import annotations

import atexit
import collections
import os
import sys
import threading
import time
from pathlib import Path

MAX_DEPTH = 40
TOP = 30


REPO = str(Path(__file__).resolve().parents[2]) + "/"
INSTALLED = ("site-packages/", "vllm-site/")  # installed packages: named from the package on


def _frame_name(frame) -> str:
    """``path:function``, the path relative to the checkout or to the installed packages' folder."""
    code = frame.f_code
    path = code.co_filename
    if path.startswith(REPO):
        path = path[len(REPO):]
    else:
        for marker in INSTALLED:
            at = path.find(marker)
            if at >= 0:
                path = path[at + len(marker):]
                break
    return f"{path}:{code.co_name}"


class StackSampler:
    def __init__(self, out: Path, interval_s: float):
        self.out, self.interval_s = out, interval_s
        self.stacks: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.samples = 0
        self.began = time.monotonic()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()
        atexit.register(self.dump)

    def _run(self) -> None:
        me = threading.get_ident()
        last_dump = time.monotonic()
        while True:
            time.sleep(self.interval_s)
            names = {t.ident: t.name for t in threading.enumerate()}
            frames = sys._current_frames()
            with self._lock:
                self.samples += 1
                for ident, frame in frames.items():
                    if ident == me:
                        continue
                    chain = [f"{_frame_name(frame)}:{frame.f_lineno}"]  # the innermost with its line
                    frame = frame.f_back
                    while frame is not None and len(chain) < MAX_DEPTH:
                        chain.append(_frame_name(frame))
                        frame = frame.f_back
                    self.stacks[names.get(ident, str(ident))][";".join(reversed(chain))] += 1
            del frames
            if time.monotonic() - last_dump > 5.0:
                last_dump = time.monotonic()
                self.dump()

    def dump(self) -> None:
        with self._lock:
            stacks = {name: collections.Counter(c) for name, c in self.stacks.items()}
            samples = self.samples
        role = _role()  # read at dump time: at start-up, __main__ and sys.argv are not yet final
        lines = [f"# stacks of {role} {' '.join(sys.argv)[:200]} (pid {os.getpid()}): {samples} samples every {self.interval_s * 1e3:.1f} ms "
                 f"over {time.monotonic() - self.began:.1f} s"]
        folded = []
        for name, counter in sorted(stacks.items(), key=lambda kv: -sum(kv[1].values())):
            total = sum(counter.values())
            inclusive: collections.Counter = collections.Counter()
            own: collections.Counter = collections.Counter()
            for stack, n in counter.items():
                frames = stack.split(";")
                own[frames[-1]] += n
                for f in {*frames[:-1], frames[-1].rsplit(":", 1)[0]}:
                    inclusive[f] += n
            lines.append(f"\n## thread {name}: {total} samples")
            lines.append("inclusive:")
            lines += [f"  {n / total:6.1%}  {f}" for f, n in inclusive.most_common(TOP)]
            lines.append("self:")
            lines += [f"  {n / total:6.1%}  {f}" for f, n in own.most_common(TOP)]
            folded += [f"{name};{stack} {n}" for stack, n in counter.most_common()]
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"stacks-{role}-{os.getpid()}.txt"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n\n# folded\n" + "\n".join(folded) + "\n")
        tmp.replace(path)


def _role() -> str:
    argv = " ".join(sys.argv)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = (spec.name if spec is not None else os.path.basename(sys.argv[0] if sys.argv else "python")) or "python"
    if "multiprocessing" in argv:
        name = "spawned"  # a spawn start method's child: vLLM's engine core, a load-generator process
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40]


_SAMPLER: StackSampler | None = None


def start_from_env() -> None:
    """Start sampling this process when ``STACK_SAMPLES_DIR`` is set (once per process)."""
    global _SAMPLER
    out = os.environ.get("STACK_SAMPLES_DIR")
    if not out or _SAMPLER is not None:
        return
    _SAMPLER = StackSampler(Path(out), float(os.environ.get("STACK_SAMPLES_INTERVAL_S", "0.002")))
    _SAMPLER.start()
