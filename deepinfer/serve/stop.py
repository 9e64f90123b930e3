"""Stop strings applied to the detokenized stream (OpenAI semantics: the stop string and all
text after it are not returned; the finish reason is ``"stop"``).

While streaming, text that could be the start of a stop string is held back until the next
piece shows whether it is one, so a client never sees part of a stop string.
"""

from __future__ import annotations


class StopMatcher:
    """Feed text increments; get the text that is safe to emit and whether a stop hit."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Return the text to emit now; after a hit, ``stopped`` is True and nothing more is
        emitted."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return buf[:cut]
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The held-back text, once the stream ends without a hit."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
