"""What the tools print and read as text: the one table printer (:func:`text_table`), the one
byte formatter (:func:`format_bytes`) and the one parser of a size with a byte suffix
(:func:`parse_size`).  Pure Python, like all of ``job_list``: the Paddle-free command line
prints with them too."""
from __future__ import annotations

import re
from typing import Collection, Optional, Sequence, Tuple

#: binary byte suffixes (1 KB = 1024 B), upper case; the IEC names (KiB ...) mean the same
BYTE_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40,
              "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}
#: a decimal number, then an optional suffix of letters ("48MB", "1.5 gib", "12")
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> Optional[Tuple[float, Optional[int]]]:
    """``"48 MiB"`` -> ``(48.0, 2**20)``, ``"12"`` -> ``(12.0, None)``: a number >= 0 and the
    bytes its suffix stands for (:data:`BYTE_UNITS`, any case; None without a suffix); None
    for any other text (the caller says what it expected, in its own words)."""
    match = _SIZE.match(text)
    if match is None:
        return None
    number, suffix = float(match.group(1)), match.group(2).upper()
    if not suffix:
        return number, None
    unit = BYTE_UNITS.get(suffix)
    return None if unit is None else (number, unit)


def format_bytes(n: float, exact: bool = False) -> str:
    """``n`` bytes in the largest binary unit below it, three significant digits (``"128 KB"``,
    ``"-1.5 MB"``, ``"12 B"``); ``exact`` adds the count (``"1.08 KB (1105 bytes)"``)."""
    sign = "-" if n < 0 else ""
    size = abs(float(n))
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            break
        size /= 1024
    shown = f"{sign}{size:.0f} {unit}" if unit == "B" else f"{sign}{size:.3g} {unit}"
    return f"{shown} ({int(n)} bytes)" if exact else shown


def text_table(rows: Sequence[Sequence[object]], left: Collection[int] = ()) -> str:
    """``rows`` (the first is the header, underlined with dashes) as columns two spaces apart:
    the columns numbered in ``left`` aligned left (names), the others right (numbers);
    no trailing spaces."""
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = []
    for k, row in enumerate(cells):
        lines.append("  ".join(cell.ljust(w) if i in left else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
