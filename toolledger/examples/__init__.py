"""Runnable examples: `toolledger demo` (billing reconciliation) and `toolledger demo penny`."""
