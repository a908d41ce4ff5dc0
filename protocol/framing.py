"""Newline-delimited JSON framing for stdio transports.

``LineBuffer.receive_data(bytes)`` returns complete lines (decoded, without the newline) and
``Oversize`` markers for lines longer than the cap. An oversized line is discarded as it streams
in, so memory stays bounded by the cap whatever the peer sends. ``b""`` marks EOF: a partial line
left at EOF is returned if it fits.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Oversize:
    """A line over the cap was dropped; ``size`` counts the bytes seen (at least the cap + 1)."""

    size: int


@attrs.frozen
class Undecodable:
    """A line that is not valid UTF-8."""

    size: int


Framed = str | Oversize | Undecodable


class LineBuffer:
    def __init__(self, max_line_bytes: int) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        self._discarding = 0  # bytes dropped of the current oversized line, 0 when not dropping
        self._eof = False

    def receive_data(self, data: bytes | bytearray) -> list[Framed]:
        out: list[Framed] = []
        if not data:
            self._eof = True
            if self._discarding:
                out.append(Oversize(self._discarding))
                self._discarding = 0
            elif self._buf:
                out.extend(self._emit(bytes(self._buf)))
            self._buf.clear()
            return out
        start = 0
        if self._buf or self._discarding:  # the first piece ends the line already begun
            nl = data.find(b"\n")
            self._add(data if nl < 0 else data[:nl])
            if nl < 0:
                return out
            self._end_line(out)
            start = nl + 1
        # the complete lines that follow are split off at once
        end = data.rfind(b"\n", start)
        if end >= 0:
            limit = self.max_line_bytes
            for raw in data[start:end].split(b"\n"):
                if len(raw) > limit:
                    out.append(Oversize(len(raw)))
                else:
                    out.extend(self._emit(raw))
            start = end + 1
        if start < len(data):
            self._add(data[start:])
        return out

    def _add(self, piece: bytes | bytearray) -> None:
        """A piece (holding no newline) of the line being received."""
        if self._discarding:
            self._discarding += len(piece)
        elif len(self._buf) + len(piece) > self.max_line_bytes:
            self._discarding = len(self._buf) + len(piece)
            self._buf.clear()
        else:
            self._buf += piece

    def _end_line(self, out: list[Framed]) -> None:
        if self._discarding:
            out.append(Oversize(self._discarding))
            self._discarding = 0
        else:
            out.extend(self._emit(bytes(self._buf)))
            self._buf.clear()

    @staticmethod
    def _emit(raw: bytes | bytearray) -> list[Framed]:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw or raw.isspace():
            return []  # blank lines are skipped
        try:
            return [raw.decode("utf-8")]
        except UnicodeDecodeError:
            return [Undecodable(len(raw))]

    @property
    def buffered(self) -> int:
        return len(self._buf)


def encode_line(text: str) -> bytes:
    """One message as a stdio line. ``json.dumps`` never emits a raw newline."""
    return text.encode("utf-8") + b"\n"
