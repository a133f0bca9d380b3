"""`toolledger demo [penny] [--stack]`: the examples, runnable with nothing but Python.

`toolledger demo` runs the billing reconciliation example on the embedded ledger (memory log,
memory ledger, in-process projector) in a few seconds; `--stack` runs it against Kafka and
PostgreSQL (`TOOLLEDGER_*`, else the dev stack, which it starts if needed).
`toolledger demo penny` shows Penny the refund bot paying twice without the ledger, once with.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from pathlib import Path

import click
from rich.console import Console

from toolledger.cli import entry
from toolledger.cli.entry import CommandFailed, ExitStatus


@click.command()
@click.argument("which", type=click.Choice(["billing", "penny"]), default="billing")
@click.option(
    "--stack", is_flag=True, help="Use Kafka + PostgreSQL instead of the embedded ledger."
)
def demo(which: str, stack: bool) -> None:
    """Run an example: billing reconciliation (default) or Penny the refund bot."""
    try:
        from examples.billing_reconciliation import demo as billing_demo
        from examples.penny_refund_bot import bot
    except ImportError as exc:
        raise CommandFailed(
            f"the examples are not importable ({exc}); run it from a checkout installed with "
            "`pip install -e .` (make demo does)",
            ExitStatus.USAGE,
        ) from exc
    # Piped, 120 columns: wide enough that no key or event name is split, narrow enough for
    # the demo's rules (a pipe's usual 2,000 would draw each across a screen).
    console = entry.console(pipe_width=120)
    if which == "penny":
        unguarded, guarded = asyncio.run(bot.main(console))
        sys.exit(ExitStatus.OK if (unguarded, guarded) == (2, 1) else ExitStatus.NO)
    if not stack:
        asyncio.run(billing_demo.main(console))
        return
    asyncio.run(_on_stack(console))


async def _on_stack(console: Console) -> None:
    from examples.billing_reconciliation import demo as billing_demo
    from toolledger import Ledger
    from toolledger.devstack import DevStack, resolve_services
    from toolledger.events.signing import SigningKey
    from toolledger.settings import OperatorSettings, ProjectorSettings, load_settings

    services = resolve_services() or DevStack(Path.cwd()).up()
    suffix = secrets.token_hex(4)
    # The demo plays every role in one process: the projector's public key and the API's
    # private key are one fresh pair.
    key = SigningKey.generate("demo")
    shared: dict[str, object] = {
        "database_url": services.database_url,
        "kafka_bootstrap": services.kafka_bootstrap,
        "schema_name": f"toolledger_demo_{suffix}",
        "topic_prefix": f"demo-{suffix}.",
        "partitions": 2,
    }
    settings = load_settings(OperatorSettings, **shared, signing_keys=(key,))
    projecting = load_settings(ProjectorSettings, **shared, verify_keys=key.verify_keys())
    console.print(
        f"Kafka {services.kafka_bootstrap}, PostgreSQL schema {settings.schema_name}, "
        f"topics {settings.events_topic} ..."
    )
    async with await Ledger.connect(projecting, run_projector=True) as ledger:
        await billing_demo.run_scenarios(ledger, settings, console)
