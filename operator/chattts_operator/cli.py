"""``chattts-operator``: run the operator, or print the CRDs.

    chattts-operator run [--namespace NS ...|--all-namespaces] [--liveness URL] [--verbose]
    chattts-operator crds | kubectl apply --server-side -f -

Settings come from CHATTTS_OPERATOR_* variables (settings.py); a bad one stops the
operator before it connects to anything.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from typing import Callable

from chattts_operator.core.settings import OperatorSettings, SettingsError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chattts-operator", description="ChatTTS Kubernetes operator")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run the operator (the default)")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[],
                       help="watch this namespace (repeatable); default: CHATTTS_OPERATOR_WATCH_NAMESPACES, "
                            "else the whole cluster")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster")
    run.add_argument("--liveness", default=None,
                     help="liveness endpoint URL, e.g. http://0.0.0.0:8080/healthz "
                          "(default: CHATTTS_OPERATOR_HEALTH_PORT)")
    run.add_argument("-v", "--verbose", action="store_true")
    run.add_argument("--debug", action="store_true")
    sub.add_parser("crds", help="print the CRDs as YAML")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["run", *argv]
    args = build_parser().parse_args(argv)
    if args.command == "crds":
        from chattts_operator.api import CRD_KINDS  # noqa: PLC0415 - keep `run` from importing crdgen
        from chattts_operator.crdgen import render  # noqa: PLC0415
        sys.stdout.write("---\n".join(render(kind) for kind in CRD_KINDS))
        return 0

    try:
        settings = OperatorSettings.from_env()
    except SettingsError as err:
        print(f"chattts-operator: {err}", file=sys.stderr)
        return 2
    namespaces = [] if args.all_namespaces else (args.namespace or list(settings.watch_namespaces))
    liveness = args.liveness
    if liveness is None and settings.health_port:
        liveness = f"http://0.0.0.0:{settings.health_port}/healthz"

    import kopf  # noqa: PLC0415 - keep `crds` and errors fast

    import chattts_operator.handlers  # noqa: F401,PLC0415 - registers the handlers

    kopf.configure(verbose=args.verbose, debug=args.debug)  # sets up logging
    if not args.debug:
        # The client logs every response body at DEBUG: only with --debug.
        logging.getLogger("kubernetes_asyncio").setLevel(logging.INFO)
    if not args.verbose and not args.debug:
        # kopf logs every handler success at INFO, a line per watch event of every object (~2% of
        # the CPU at 1,000 objects, findings F5); its warnings and errors still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    operator = kopf.operator(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=liveness,
        memo=kopf.Memo(watch_namespaces=namespaces),
    )
    # kopf.run would take asyncio's default loop (kopf picks uvloop only in its own CLI).
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        with contextlib.suppress(asyncio.CancelledError):
            runner.run(operator)
    return 0


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop the operator runs on: ``uvloop`` (when installed) or asyncio's (None)."""
    if name == "uvloop":
        try:
            import uvloop  # noqa: PLC0415 - optional: asyncio's loop works too, only slower
        except ImportError:
            logging.getLogger("chattts_operator").warning("uvloop is not installed: running on asyncio's loop")
            return None
        return uvloop.new_event_loop
    return None
