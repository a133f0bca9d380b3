"""Penny the refund bot: a double payout, and how the ledger prevents it."""
