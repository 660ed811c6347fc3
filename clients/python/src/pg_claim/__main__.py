"""python3 -m pg_claim: the pg-claim command (pg_claim.cli)."""
import sys

from .cli import main

sys.exit(main())
