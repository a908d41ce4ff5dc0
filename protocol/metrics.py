"""The Prometheus text exposition format (version 0.0.4), for the console's ``/metrics``.

:func:`exposition` writes metric families (a name, help text, a type and samples, each with
its labels and a value) as the format has them; :func:`label_value` quotes a label's value
(backslash, double quote and line feed escaped), so a server's or an agent's name can never
end a line or a label early. Pure: the caller gives the values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

import attrs

#: What a metric or label name may be.
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})


@attrs.frozen
class Family:
    """One metric: its ``name``, ``help`` text, ``type`` (``gauge`` or ``counter``) and its
    samples, each a mapping of label names to values and the sample's value."""

    name: str
    help: str
    type: str
    samples: Sequence[tuple[Mapping[str, str], float]]


def label_value(value: str) -> str:
    """``value`` as a quoted label value."""
    return '"' + value.translate(_ESCAPES) + '"'


def number(value: float) -> str:
    """A sample's value as the format writes it (``+Inf``, ``-Inf``, ``NaN`` included)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def exposition(families: Iterable[Family]) -> str:
    """The families as one exposition: ``# HELP``, ``# TYPE`` and a line per sample."""
    lines: list[str] = []
    for family in families:
        if not NAME.fullmatch(family.name):
            raise ValueError(f"not a metric name: {family.name!r}")
        text = family.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines += [f"# HELP {family.name} {text}", f"# TYPE {family.name} {family.type}"]
        for labels, value in family.samples:
            for key in labels:
                if not NAME.fullmatch(key) or key.startswith("__"):
                    raise ValueError(f"not a label name: {key!r}")
            inner = ",".join(f"{k}={label_value(v)}" for k, v in labels.items())
            lines.append(
                f"{family.name}{{{inner}}} {number(value)}"
                if inner
                else f"{family.name} {number(value)}"
            )
    return "\n".join(lines) + "\n"
