"""Known defects of the library that the model steps around while someone fixes them.

Each has a name, what it is, and how the model steps around it: ``avoid`` (the rule that would hit
it is off) or ``tolerate`` (the check that would fail is relaxed, and each time it was needed is
counted in the run's summary as ``known defect: <name>``). ``AIODELAYQ_MODEL_STRICT=<name>,...`` (or
``all``) turns the rule on, or the check strict: whoever fixes one runs the model so, then deletes
its entry here (its regression test is named in it).
"""

from __future__ import annotations

import os

from .tally import tally

__all__ = ["KNOWN", "strict", "tolerated"]

# name -> (how the model steps around it, what it is and its regression test); none known now.
KNOWN: dict[str, tuple[str, str]] = {}

_STRICT = {name.strip() for name in os.environ.get("AIODELAYQ_MODEL_STRICT", "").split(",") if name.strip()}


def strict(name: str) -> bool:
    """Whether the model checks (or calls) what the known defect ``name`` breaks."""
    if name not in KNOWN:
        raise KeyError(f"no known defect {name!r}: {sorted(KNOWN)}")
    return "all" in _STRICT or name in _STRICT


def tolerated(name: str) -> bool:
    """Whether to let pass what the known defect ``name`` does (counted), rather than fail."""
    if strict(name):
        return False
    tally(f"known defect: {name}")
    return True
