"""The ``record-skipped`` trace event: a warning line naming the stored record left out."""

from __future__ import annotations

from actors.trace import TraceEvent
from actors.transcript.lines import WARNING, format_event, level_of


def test_a_skipped_record_is_one_warning_line() -> None:
    data = {"what": "message", "key": "m1", "seq": 4, "reason": "does not\ndecode"}
    event = TraceEvent(kind="record-skipped", data=data, ts=1e9)
    assert level_of(event) == WARNING
    assert format_event(event) == "! skipped stored message 'm1': does not decode"


def test_the_cap_report_names_no_record() -> None:
    data = {"what": "", "key": "", "seq": None, "reason": "more than 1024; the rest not listed"}
    line = format_event(TraceEvent(kind="record-skipped", data=data, ts=1e9))
    assert line == "! skipped stored records: more than 1024; the rest not listed"
