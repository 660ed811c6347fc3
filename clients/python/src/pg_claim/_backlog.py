"""Lease mode's balance (docs/leases.md, "Balancing"): each held slot's
weight, its pending rows ahead of the walk's cursor, as a Worker's batches
count them. The same rule as clients/node/lib/backlog.js.

A slot's rows are counted in windows, each one bounded index walk of
my_items in a batch's own message: the first from the walk's cursor (the
batch's rows included), each next one after the last row the previous one
counted, while the previous one came back full, at most once per
COUNT_EVERY_S, each twice as large as the one before (up to MAX_WINDOW
batches); once a window comes back short the count is whole, and a window
after its last row every REFRESH_S adds the rows inserted since. Between
counts the weight is the rows counted less the rows the walk has fetched
since; a pass that reaches the share's end weighs 0 and starts over. So a
count costs at most one walk over the slot's pending rows, however many
there are, and a heavy slot is known as heavy within a few seconds.

A worker serves its held slots in turn, each in proportion to its weight
(stride scheduling: the slot with the least pass goes next, and its pass
grows by the lightest weight over its own), at most SHARE_CAP batches of a
heavy slot per batch of the lightest: a holder of one heavy slot and a few
light ones spends its time on the heavy one, whose rows set the fleet's
end, while the planner hands the light ones to holders with less left.
Equal weights, or none known, are plain round robin.

A batch that finds rows in a slot that weighed 0 (its last pass reached the
share's end: new rows came) starts a census, at most once per CENSUS_EVERY_S:
every other held slot that weighs 0 is counted at once, one first window
each in one message, and the weights are reported together, so that after
a burst of new rows the planner knows every slot's weight within one batch,
not one slot per batch (a holder of 32 slots visits each only every 32nd
batch). The slots a worker took since its last batch are counted the same
way, once each: until then the planner would weigh them by their former
holder's last reports, which count the rows that holder did since.

The weight a batch's report sends is the slot's weight once that batch is
done (the weight less the batch's rows, at least 1: between two batches of
a slot nothing lowers it, and a weight that counts the batch in hand runs a
batch above the rows left until the slot's next batch), or None (the last
one stands) unless it reached or left 0, moved by SEND_CHANGE of the last
one sent once that one is SEND_MIN_S old, or the last one sent is
SEND_EVERY_S old. A count still partial (its last window came back full)
sends nothing until it is whole or its windows have grown to MAX_WINDOW: a
lower bound taken as the weight makes a holder whose slots are half
counted look light, and the planner would hand it the slots of holders
whose counts are whole (in an even fleet of 32 workers on n = 64 with
15,625 rows per slot, 601 hand-overs in a 1,000,000-row drain, against 27
to 49 once partial counts were not sent; `scripts/bench balance --scenario e`).
A batch with
no weight to send carries no report at all unless the worker's last one is
REPORT_EVERY_S old (the report also tells the slots wanted elsewhere). A
report costs the server about three times a fence (it writes the lease
row): sent at every batch whose weight moved by a tenth, which near a
share's end is every batch, it took a sixth of the server's time per
batch with short batches."""
from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

FIRST_WINDOW = 40  # batches
MAX_WINDOW = 1000  # batches
COUNT_EVERY_S = 0.25
REFRESH_S = 5.0
SEND_CHANGE = 0.1
SEND_MIN_S = 1.0
SEND_EVERY_S = 5.0
REPORT_EVERY_S = 0.2
SHARE_CAP = 100
CENSUS_EVERY_S = 5.0


class _Count:
    __slots__ = ("known", "last", "full", "walked", "at", "window")

    def __init__(self) -> None:
        self.known = 0  # pending rows counted ahead of the cursor of the first window
        self.last: Optional[str] = None  # the key of the last row counted
        self.full = False  # the last window came back full: more rows beyond `last`
        self.walked = 0  # rows the walk fetched since the first window
        self.at = 0.0  # the time of the last window
        self.window = 2 * FIRST_WINDOW  # the next window's, in batches


class Backlog:
    """The weights of the held slots, for one Worker (its batch size)."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self._counts: Dict[int, _Count] = {}
        self._weights: Dict[int, int] = {}
        self._sent: Dict[int, Tuple[int, float]] = {}
        self._pending: Dict[int, Tuple[bool, int]] = {}  # slot -> (a first window, its bound)
        self._pass: Dict[int, float] = {}
        self._asked: Set[int] = set()  # held slots a census counts for the first time
        self._reported = float("-inf")
        self._census_at = float("-inf")

    def window(self, slot: int, cursor: Optional[str], now: float) -> Optional[Tuple[Optional[str], int]]:
        """The window to count in the slot's next batch: (after, bound), or
        None when no count is due."""
        c = self._counts.get(slot)
        if c is not None and (now - c.at < (COUNT_EVERY_S if c.full else REFRESH_S)):
            return None
        if c is None or c.last is None or c.walked >= c.known:  # from the cursor (the walk passed the count)
            self._pending[slot] = (True, FIRST_WINDOW * self.batch)
            return cursor, FIRST_WINDOW * self.batch
        bound = (c.window if c.full else FIRST_WINDOW) * self.batch
        self._pending[slot] = (False, bound)
        return c.last, bound

    def batch_done(self, slot: int, fetched: int, counted: Optional[Tuple[int, Optional[str]]], *, end: bool,
                   now: float) -> None:
        """After a batch of the walk: the rows it fetched, its window's
        (count, last key) if it counted one, and whether the share was
        walked to its end."""
        first, bound = self._pending.pop(slot, (True, 0))
        if end:
            self._counts.pop(slot, None)
            self._weights[slot] = 0
            return
        c = self._counts.get(slot)
        if counted is not None:
            k, last = counted
            if first or c is None:
                c = self._counts[slot] = _Count()
                c.known = k
            else:
                c.known += k
                if c.full:  # each next window of a count twice the one before
                    c.window = min(c.window * 2, MAX_WINDOW)
            c.last = last if last is not None else c.last
            c.full = k >= bound
            c.at = now
        if c is None:
            self._weights[slot] = max(self.batch, self._weights.get(slot) or 0)
            return
        c.walked += fetched
        self._weights[slot] = max(self.batch, c.known - c.walked)

    def census(self, slot: int, before: Optional[int], held: List[int], now: float) -> List[int]:
        """After a batch of `slot`, which weighed `before`: the other held
        slots to count now: those of `held` this worker had no weight of
        (taken since its last batch, `slot` too when this was its first
        batch: each once, so that all are reported together), and, when
        the batch found rows in a slot that weighed 0, those that weigh 0,
        at most once per CENSUS_EVERY_S."""
        new = [s for s in held if (s not in self._weights or (s == slot and before is None))
               and s not in self._asked]
        self._asked.update(new)
        if before != 0 or not self._weights.get(slot) or now - self._census_at < CENSUS_EVERY_S:
            return sorted(new)
        empty = [s for s in held if s != slot and self._weights.get(s) == 0]
        if empty:
            self._census_at = now
        return sorted(new + empty)

    def census_bound(self) -> int:
        """The rows a census counts at most per slot: one first window."""
        return FIRST_WINDOW * self.batch

    def counted(self, slot: int, pending: int, last: Optional[str], now: float) -> Optional[int]:
        """A census's count of the slot from its share's start (the walk's
        cursor after a pass's end): its weight, taken as sent, or None when
        the count is partial (nothing to send yet)."""
        self._pending.pop(slot, None)
        if pending == 0:
            self._counts.pop(slot, None)
            self._weights[slot] = 0
        else:
            c = self._counts[slot] = _Count()
            c.known, c.last, c.full, c.at = pending, last, pending >= self.census_bound(), now
            self._weights[slot] = max(self.batch, pending)
            if self.partial(slot):
                return None
        self._sent[slot] = (self._weights[slot], now)
        return self._weights[slot]

    def partial(self, slot: int) -> bool:
        """Whether the slot's count is still a lower bound (its last window
        came back full) too small to send: a weight is sent once the count
        is whole, or once its windows have grown to MAX_WINDOW (a slot
        that large weighs at least that)."""
        c = self._counts.get(slot)
        return c is not None and c.full and c.window < MAX_WINDOW

    def pick(self, turn: List[int]) -> Optional[int]:
        """The slot of `turn` (held, not resting) to serve next, by weight;
        None when fewer than two slots or no weight: round robin."""
        known = [w for w in (self._weights.get(s) for s in turn) if w]
        if len(turn) < 2 or not known:
            return None
        lightest = min(known)
        front = min((self._pass[s] for s in turn if s in self._pass), default=0.0)
        for s in turn:  # a new slot, or one back from resting, starts at the front
            self._pass[s] = max(self._pass.get(s, front), front)
        slot = min(turn, key=lambda s: (self._pass[s], s))
        share = min(max((self._weights.get(slot) or lightest) / lightest, 1.0), SHARE_CAP)
        self._pass[slot] += 1.0 / share
        return slot

    def weight(self, slot: int) -> Optional[int]:
        return self._weights.get(slot)

    def ahead(self, slot: int) -> Optional[int]:
        """The slot's weight once the batch about to run is done: a counted
        weight less that batch's rows (at least 1: the batch does not end
        the pass as far as it is known), which the report of that batch
        sends; the weight stands until the slot's next batch."""
        w = self._weights.get(slot)
        if not w or slot not in self._counts:
            return w
        return max(1, w - self.batch)

    def to_send(self, slot: int, now: float) -> Optional[int]:
        w = self.ahead(slot)
        if w is None or self.partial(slot):
            return None
        last = self._sent.get(slot)
        if last is not None and now - last[1] < SEND_EVERY_S and (w == 0) == (last[0] == 0) \
                and (abs(w - last[0]) < SEND_CHANGE * max(last[0], 1) or now - last[1] < SEND_MIN_S):
            return None
        self._sent[slot] = (w, now)
        return w

    def report(self, slot: int, now: float) -> Tuple[bool, Optional[int]]:
        """Whether the slot's next batch carries a report, and its weight
        (None: the last one stands)."""
        w = self.to_send(slot, now)
        if w is None and now - self._reported < REPORT_EVERY_S:
            return False, None
        self._reported = now
        return True, w

    def forget(self, slot: int) -> None:
        for d in (self._counts, self._weights, self._sent, self._pending, self._pass):
            d.pop(slot, None)  # type: ignore[attr-defined]
        self._asked.discard(slot)

    def clear(self) -> None:
        for d in (self._counts, self._weights, self._sent, self._pending, self._pass, self._asked):
            d.clear()  # type: ignore[attr-defined]
