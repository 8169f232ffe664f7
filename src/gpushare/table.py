"""Plain-text tables for terminals: columns padded to their widest cell."""

from collections.abc import Sequence


def render(header: Sequence[str], rows: Sequence[Sequence[object]], gap: int = 2) -> str:
    cells = [list(map(str, header)), *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        (" " * gap)
        .join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        .rstrip()
        for row in cells
    ]
    return "\n".join(lines)
