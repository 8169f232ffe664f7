"""Command-line entry points: `gpushare` (demo, simulate) and the tools around it."""
