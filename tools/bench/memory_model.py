"""The simulator's memory model against the peak bytes measured through the engine.

The simulator counts a rank's live activations in *units* (one micro-batch's forward of one
stage on that rank; ``sim_peak_units`` per rank).  Through the engine a rank's measured peak
is its resident bytes (parameters, optimizer states, gradient buffers) plus the step's
transient peak.  Per rank, two schedules with different peak units fix the two unknowns, the
bytes of one unit and everything else (:func:`calibrate`: FThenB keeps all m forwards, 1F1B
about pp - rank); every other schedule's peak is then a prediction (:func:`predictions`), and
its error says how well the model the searches trust (``auto``'s memory limit) describes the
real executor.  Peak bytes are exact (the allocator's statistics), so the error is a property of
the model, not of noise.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

#: the two schedules that calibrate each rank's unit and offset
CALIBRATION = ("FThenB", "1F1B")
#: the largest |measured / predicted - 1| the model is held to (issue 31)
MEMORY_MODEL_TOLERANCE = 0.10


def calibrate(first: dict, second: dict) -> List[Tuple[float, float]]:
    """Per rank (bytes per unit, bytes besides the units) from two rows' ``peak_bytes`` and
    ``sim_peak_units``: the line through both points."""
    out = []
    for rank, (b1, b2, u1, u2) in enumerate(zip(first["peak_bytes"], second["peak_bytes"],
                                                first["sim_peak_units"],
                                                second["sim_peak_units"])):
        if u1 == u2:
            raise ValueError(f"rank {rank}: {first['schedule']} and {second['schedule']} peak "
                             f"at the same {u1:g} units; they cannot calibrate the unit")
        unit = (b1 - b2) / (u1 - u2)
        out.append((unit, b2 - u2 * unit))
    return out


def predictions(rows: Sequence[dict]) -> List[Dict[str, object]]:
    """For each m, each pipesplit row's measured and predicted peak per rank, and the error;
    ``calibration`` marks the two rows the unit came from (error 0 by construction).  Rows
    whose schedule was re-planned (``auto``: its measured plan differs from the one simulated)
    are left out.  Empty without both calibration rows."""
    out = []
    for m in sorted({r["m"] for r in rows}):
        ours = {r["schedule"]: r for r in rows if r["m"] == m and r["impl"] == "pipesplit"}
        if not all(name in ours for name in CALIBRATION):
            continue
        fit = calibrate(*(ours[name] for name in CALIBRATION))
        for name, row in ours.items():
            if row.get("replanned"):
                continue
            for rank, ((unit, rest), measured, units) in enumerate(
                    zip(fit, row["peak_bytes"], row["sim_peak_units"])):
                predicted = rest + units * unit
                out.append({"m": m, "schedule": name, "rank": rank, "sim_peak_units": units,
                            "measured_bytes": int(measured), "predicted_bytes": int(predicted),
                            "unit_bytes": int(unit), "error": measured / predicted - 1,
                            "calibration": name in CALIBRATION})
    return out


def memory_model_table(entries: Sequence[dict]) -> List[str]:
    """The report's lines: per row, each rank's units, measured and predicted MiB, error."""
    if not entries:
        return []
    lines = ["", f"memory model: peak per rank = bytes besides + units x unit bytes, both "
             f"fitted per rank on {' and '.join(CALIBRATION)}; the others predicted "
             f"(|error| <= {MEMORY_MODEL_TOLERANCE:.0%} is the goal)"]
    for e in entries:
        lines.append(f"  m={e['m']} {e['schedule']:<10} rank {e['rank']}: "
                     f"{e['sim_peak_units']:g} units x {e['unit_bytes'] / 2**20:.2f} MiB, "
                     f"measured {e['measured_bytes'] / 2**20:.2f} MiB, predicted "
                     f"{e['predicted_bytes'] / 2**20:.2f} MiB, error {e['error']:+.1%}"
                     + (" (calibration)" if e["calibration"] else ""))
    return lines
