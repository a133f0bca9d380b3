"""Refunds over HTTP with `toolledger.http`, against a Stripe-like fake that replays answers."""
