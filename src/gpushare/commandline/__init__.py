"""What every command-line entry point of gpushare shares: the --version flag, reading
the files its flags name, and turning the errors a user can act on into one line on
stderr and an exit status (2 for a flag that cannot work, 1 for a run that cannot).

The bottom layer of the import contracts: the CLI, every component and every adapter
may use it, and it uses only the core and the standard library (and knows the
Kubernetes client's ConfigException, which all of them may meet)."""

from gpushare.commandline.failure import UsageError, exit_status
from gpushare.commandline.files import InputFileError, check_directory, read_text, read_yaml
from gpushare.commandline.version import add_version_flag, package_version

__all__ = [
    "InputFileError",
    "UsageError",
    "add_version_flag",
    "check_directory",
    "exit_status",
    "package_version",
    "read_text",
    "read_yaml",
]
