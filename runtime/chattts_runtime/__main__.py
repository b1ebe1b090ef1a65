"""Console entry point: ``chattts-runtime``."""
import sys


def main() -> int:
    from chattts_runtime.cli import main as cli_main  # noqa: PLC0415
    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
