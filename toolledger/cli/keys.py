"""`toolledger keys new KEY_ID`: make an Ed25519 key pair for operator signatures.

Prints the two settings: `TOOLLEDGER_SIGNING_KEYS` (private: the operator API and CLI only) and
`TOOLLEDGER_VERIFY_KEYS` (public: every projector and replay). Deploy the public key to every
projector before any signer uses it ("deploy keys before signers"), and keep it there forever
once an event was signed with it; docs/security.md describes rotation.
"""

from __future__ import annotations

import click

from toolledger.events.signing import SigningKey, fingerprint


@click.group()
def keys() -> None:
    """Operator signing keys (Ed25519)."""


@keys.command("new")
@click.argument("key_id")
def new(key_id: str) -> None:
    """Print a new key pair named KEY_ID (letters, digits, '.', '_', '-'), e.g. `ops-2026-01`."""
    try:
        key = SigningKey.generate(key_id)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="KEY_ID") from exc
    click.echo(f"# public key {key_id} (fingerprint {fingerprint(key.public_bytes())}):")
    click.echo(
        "# add to every projector's TOOLLEDGER_VERIFY_KEYS first (comma-separated, keep old ones)"
    )
    click.echo(key.public_setting())
    click.echo("# private key: the operator API's and CLI's TOOLLEDGER_SIGNING_KEYS, nowhere else")
    click.echo(key.setting())
