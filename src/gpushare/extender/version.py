"""The version the extender reports on /version and in its start line."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("kube-gpushare")
except PackageNotFoundError:  # running from a source tree that was never installed
    VERSION = "0+unknown"
