"""`StopStringMatcher`: stop strings found in the detokenised text, across token boundaries.

Matching runs on text, not tokens: a stop string may start in one token and end several tokens
later, and one token may hold a stop string in its middle. While the text generated so far ends
with a prefix of a stop string, that tail is held back from the caller (a streaming client
never sees text that is later cut); it is released as soon as it can no longer start a match,
or at the end of the request.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Tracks one request's output text against its ``stop`` strings.

    Example::

        m = StopStringMatcher(["</s>"])
        assert m.push("Hello </") == ("Hello ", None)   # "</" might start "</s>"
        assert m.push("s> more") == ("", "</s>")        # cut before the stop string
    """

    def __init__(self, stops: Sequence[str], *, include_in_output: bool = False) -> None:
        if not stops or any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stops must be non-empty strings, got {stops!r}")
        self.stops = tuple(stops)
        self.include_in_output = include_in_output
        self.text = ""
        self.released = 0
        self.matched: str | None = None

    def push(self, piece: str, *, check: bool = True) -> tuple[str, str | None]:
        """Add the next piece of output text; return the text now safe to release and the stop
        string that ended the output (``None`` while it runs on). ``check=False`` (before
        ``min_tokens``) appends and releases without matching."""
        if self.matched is not None:
            return "", self.matched
        self.text += piece
        if not check:
            return self._release(len(self.text)), None
        hit: tuple[int, str] | None = None
        for stop in self.stops:
            at = self.text.find(stop, self.released)
            if at >= 0 and (hit is None or at < hit[0]):
                hit = (at, stop)
        if hit is not None:
            at, stop = hit
            end = at + len(stop) if self.include_in_output else at
            self.text = self.text[:end]
            self.matched = stop
            return self._release(end), stop
        return self._release(len(self.text) - self._held_back()), None

    def flush(self) -> str:
        """Release whatever is held back (the request ended for another reason)."""
        return self._release(len(self.text))

    def _held_back(self) -> int:
        """Length of the longest unreleased tail that is a proper prefix of a stop string."""
        tail = self.text[self.released :]
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(tail)), best, -1):
                if tail.endswith(stop[:k]):
                    best = k
                    break
        return best

    def _release(self, end: int) -> str:
        out = self.text[self.released : end]
        self.released = max(self.released, end)
        return out
