"""`gpushare`: the umbrella command. Each subcommand lives in its own module."""

import argparse
import logging
import sys
from collections.abc import Sequence

from gpushare.cli import cleanup, demo, simulate
from gpushare.commandline import add_version_flag, exit_status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare",
        description="GPU sharing for Kubernetes, compatible with ACK's shared-GPU model (cGPU).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    add_version_flag(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo.register(commands)
    simulate.register(commands)
    cleanup.register(commands)
    for command in commands.choices.values():
        # Errors are said under the subcommand's name and usage ("gpushare demo: ...").
        command.set_defaults(parser=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return exit_status(args.parser, lambda: int(args.run(args) or 0))


if __name__ == "__main__":
    sys.exit(main())
