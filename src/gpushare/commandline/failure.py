"""The one place each binary turns the errors a user can act on into one line on stderr
and an exit status: 2 for a flag that cannot work (argparse's own convention, with the
usage line), 1 for a run that cannot go on (a file it cannot use, no Kubernetes API).
Any other exception is a bug and keeps its traceback."""

import argparse
import sys
from collections.abc import Callable

from kubernetes.config import ConfigException

from gpushare.cluster import ClusterError
from gpushare.commandline.files import InputFileError

KUBECONFIG_HINT = (
    "pass --kubeconfig FILE or set $KUBECONFIG to a kubeconfig, or run in a pod with a "
    "service account"
)


class UsageError(ValueError):
    """A flag's value that cannot work; the message names the flag."""


def exit_status(parser: argparse.ArgumentParser, run: Callable[[], int]) -> int:
    """What `run` returns, or the exit status of the known error it raised, said on stderr
    under the parser's name."""
    try:
        return run()
    except UsageError as err:
        parser.error(str(err))  # exits 2
    except InputFileError as err:
        return _fail(parser, str(err))
    except ConfigException as err:
        return _fail(parser, f"cannot find the Kubernetes API: {err}; {KUBECONFIG_HINT}")
    except ClusterError as err:
        return _fail(parser, f"the Kubernetes API failed: {err}")


def _fail(parser: argparse.ArgumentParser, message: str) -> int:
    print(f"{parser.prog}: {message}", file=sys.stderr)
    return 1
