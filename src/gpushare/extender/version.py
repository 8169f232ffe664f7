"""The version the extender reports on /version and in its start line: the installed
package's, as every binary's --version prints it."""

from gpushare.commandline import package_version

VERSION = package_version()
