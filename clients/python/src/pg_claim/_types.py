"""The types a Worker shares among its parts and with its handler: its
errors, a batch of rows, the columns the fetch adds to a row."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import psycopg
from psycopg import sql

Row = Dict[str, Any]
# the columns the fetch adds to the table's own (taken off before the handler sees a row)
_KEY, _STATE, _RETRY = "__pg_claim_key", "__pg_claim_state", "__pg_claim_retry_in"
_IDLE, _INTRANS = psycopg.pq.TransactionStatus.IDLE, psycopg.pq.TransactionStatus.INTRANS

class Error(Exception):
    """An error of the worker's set-up or configuration (not of an item)."""

class PoolerError(Error):
    """Session mode on a connection that is not one server session: a
    transaction-mode pooler is in between."""

class Batch(List[Row]):
    """The rows of one batch (a list of dicts, one per row, the table's
    columns), with where they come from:

    - `name`, `slot`, `token`: the fleet, the slot whose share they are, and
      the fencing token that passed in this transaction (None in session
      mode, where the session's own lock holds the slot);
    - `table`: an SQL fragment (psycopg.sql.Composable) naming the table to
      write them in: the slot's own partition (slot_partition) when the table
      is hash-partitioned with modulus n by the key (or route) column, else
      the table itself. `sql.SQL("UPDATE {} SET ...").format(rows.table)`.
    """

    name: str
    slot: int
    token: Optional[int]
    table: sql.Composable

    def __init__(self, rows: Sequence[Row], name: str, slot: int, token: Optional[int],
                 table: sql.Composable) -> None:
        super().__init__(rows)
        self.name, self.slot, self.token, self.table = name, slot, token, table

Handler = Callable[[psycopg.Connection, Batch], Any]

class _SlotLost(Exception):
    """The fence refused the slot's token (PC001), or session mode lost it."""

class _Ended(Exception):
    """The handler ended the batch's transaction (or left it aborted)."""

Keys = Dict[int, Tuple[str, Optional[str]]]  # id(row) -> (item, state of its failure record)

