"""Console entry point: ``chattts-operator``."""
import sys


def main() -> int:
    from chattts_operator.cli import main as cli_main  # noqa: PLC0415 - keep import cheap for --help
    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
