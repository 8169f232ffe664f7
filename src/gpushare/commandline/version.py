"""The version of the installed package, one answer for every binary and endpoint."""

import argparse
from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "kube-gpushare"
UNKNOWN = "0+unknown"
"""What a source tree that was never installed reports: a version, not an error."""


def package_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """--version prints `<prog> <version>` and exits 0, as argparse's version action does."""
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {package_version()}",
        help="print the program's name and version, and exit",
    )
