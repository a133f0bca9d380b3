"""Billing reconciliation: four ways a credit can go, and how the ledger settles each."""
