"""The slots a worker holds, shared by the code that claims them and the loop
that works on them."""
from __future__ import annotations

import threading
import time
from typing import Callable, Container, Dict, Iterable, List, Optional, Tuple

Slot = int
Token = int
Change = List[Tuple[Slot, Token]]


class Held:
    """slot -> token of the held slots, as the last claim returned them, with
    the work loop's cursor into each slot's share (the text of the last key
    done) and a round-robin turn over the slots.

    A slot that is not in a claim's result was given back (or lost): the loop
    stops working on it at once. A slot whose token changed was taken anew:
    its cursor is reset, so its share is walked from its start (the previous
    holder may have left items behind).

    `valid_s` is how long after a successful claim the slots may still be
    worked on when the next claims fail (the lease's ttl); `margin_s` is how
    long before that the loop stops starting batches on them.
    """

    def __init__(self, valid_s: float = float("inf"), margin_s: float = 0.0) -> None:
        self.valid_s = valid_s
        self.margin_s = margin_s
        self._lock = threading.Lock()
        self._tokens: Dict[Slot, Token] = {}
        self._cursor: Dict[Slot, Optional[str]] = {}
        self._valid_until = float("inf") if valid_s == float("inf") else 0.0
        self._last = -1

    def replace(self, rows: Iterable[Tuple[Slot, Token]], asked: float) -> Tuple[Change, Change]:
        """The result (slot, token) of a claim made at `asked`
        (time.monotonic()). Returns (gained, lost), lists of (slot, token);
        a slot whose token changed is in both."""
        new = {int(slot): int(token) for slot, token in rows}
        with self._lock:
            old = self._tokens
            lost = [(s, t) for s, t in sorted(old.items()) if new.get(s) != t]
            gained = [(s, t) for s, t in sorted(new.items()) if old.get(s) != t]
            for s, _ in lost:
                self._cursor.pop(s, None)
            self._tokens = new
            if self.valid_s != float("inf"):
                self._valid_until = asked + self.valid_s
        return gained, lost

    def failed(self, now: float) -> Change:
        """A claim failed at `now`: the slots are kept until `valid_s` after
        the last successful claim was made, then dropped. Returns the
        dropped ones."""
        with self._lock:
            if now < self._valid_until or not self._tokens:
                return []
            lost = sorted(self._tokens.items())
            self._tokens, self._cursor = {}, {}
        return lost

    def drop(self, slot: Slot, token: Token) -> bool:
        """The slot's token was refused (fence: PC001): no more work on it
        until a claim returns it again. True if it was held with `token`."""
        with self._lock:
            if self._tokens.get(slot) == token:
                del self._tokens[slot]
                self._cursor.pop(slot, None)
                return True
        return False

    def snapshot(self) -> Dict[Slot, Token]:
        """slot -> token of the slots held now."""
        with self._lock:
            return dict(self._tokens)

    def workable(self, now: Optional[float] = None) -> bool:
        """Whether batches may be started: the last successful claim is
        recent enough."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return now < self._valid_until - self.margin_s

    def next(self, now: Optional[float] = None, resting: Container[Slot] = (),
             choose: Optional[Callable[[List[Slot]], Optional[Slot]]] = None,
             ) -> Optional[Tuple[Slot, Token, Optional[str]]]:
        """The next slot to work on, round robin (or `choose`'s pick among
        them, when it makes one), passing over the `resting` ones unless
        every held slot is: (slot, token, cursor), or None when no slot is
        held or the claims are too old to work on."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if not self._tokens or now >= self._valid_until - self.margin_s:
                return None
            turn = [s for s in self._tokens if s not in resting] or list(self._tokens)
            slot = choose(sorted(turn)) if choose is not None else None
            if slot is None:
                later = [s for s in turn if s > self._last]
                slot = min(later) if later else min(turn)
            self._last = slot
            return slot, self._tokens[slot], self._cursor.get(slot)

    def valid_left(self, now: float) -> float:
        """Seconds until the slots are dropped if no claim succeeds."""
        with self._lock:
            return self._valid_until - now

    def pick(self, slot: Slot, cursor: Optional[str],
             now: Optional[float] = None) -> Optional[Tuple[Slot, Token, Optional[str]]]:
        """`slot` out of turn, its walk moved back to `cursor` (a retry due):
        (slot, token, cursor), or None when it is not held or the claims are
        too old to work on."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if slot not in self._tokens or now >= self._valid_until - self.margin_s:
                return None
            self._cursor[slot] = cursor
            return slot, self._tokens[slot], cursor

    def advance(self, slot: Slot, token: Token, cursor: Optional[str]) -> None:
        """The batch of `slot` up to key `cursor` is done (with `token`);
        None: the share was walked to its end, start again from its start."""
        with self._lock:
            if self._tokens.get(slot) == token:
                self._cursor[slot] = cursor
