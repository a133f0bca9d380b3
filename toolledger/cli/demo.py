"""`toolledger demo [penny] [--stack]`: the examples, runnable with nothing but Python.

`toolledger demo` runs the billing reconciliation example on the embedded ledger (memory log,
memory ledger, in-process projector) in a few seconds; `--stack` runs it against Kafka and
PostgreSQL (`TOOLLEDGER_*`, else the dev stack, which it starts if needed), in a schema and
topics of its own that it prints the exports of and removes at the end (`--keep` keeps them).
`toolledger demo penny` shows Penny the refund bot paying twice without the ledger, once with.
Each exits 1 when a scenario does not end as the demo says it does.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import sys

import click
from rich.console import Console

from toolledger.cli import entry
from toolledger.cli.entry import CommandFailed, ExitStatus


@click.command()
@click.argument("which", type=click.Choice(["billing", "penny"]), default="billing")
@click.option(
    "--stack", is_flag=True, help="Use Kafka + PostgreSQL instead of the embedded ledger."
)
@click.option(
    "--keep",
    is_flag=True,
    help="With --stack: keep the demo's schema and topics (they are removed by default).",
)
def demo(which: str, stack: bool, keep: bool) -> None:
    """Run an example: billing reconciliation (default) or Penny the refund bot."""
    from toolledger.examples.billing_reconciliation import demo as billing_demo
    from toolledger.examples.penny_refund_bot import bot

    # Piped, 120 columns: wide enough that no key or event name is split, narrow enough for
    # the demo's rules (a pipe's usual 2,000 would draw each across a screen).
    console = entry.console(pipe_width=120)
    if which == "penny":
        unguarded, guarded = asyncio.run(bot.main(console))
        sys.exit(ExitStatus.OK if (unguarded, guarded) == (2, 1) else ExitStatus.NO)
    wrong = asyncio.run(billing_demo.main(console) if not stack else _on_stack(console, keep))
    if wrong:
        raise CommandFailed(
            f"the demo did not end as documented ({'; '.join(wrong)}): a bug, please report "
            "it with the output above",
            ExitStatus.NO,
        )


async def _on_stack(console: Console, keep: bool) -> list[str]:
    """The billing demo on Kafka + PostgreSQL, in a schema and topics of its own.

    It signs with the checkout's dev key when `dev up` made one (so the exports `dev up`
    printed verify its log), else with a key of its own, which it prints. It prints the exports
    that point other commands at its ledger, and removes the schema and topics at the end
    unless `keep`. Returns how the scenarios did not end as documented (`run_scenarios`).
    """
    from toolledger import Ledger
    from toolledger.cli.dev import DEV_KEY_FILE, dev_signing_key
    from toolledger.devstack import (
        STATE_DIR,
        DevStack,
        find_project_dir,
        remove_namespace,
        resolve_services,
    )
    from toolledger.events.signing import SigningKey
    from toolledger.examples.billing_reconciliation import demo as billing_demo
    from toolledger.settings import OperatorSettings, ProjectorSettings, load_settings

    project = find_project_dir()
    services = resolve_services(project) or DevStack(project).up()
    suffix = secrets.token_hex(4)
    home = project / STATE_DIR
    if (home / DEV_KEY_FILE).exists():
        key, path = dev_signing_key(home)
        signing = f'"$(cat {path})"  # the dev key'
    else:
        key = SigningKey.generate(f"demo-{suffix}")
        signing = f"{key.setting()}  # the demo's own key (no dev key in {home})"
    shared: dict[str, object] = {
        "database_url": services.database_url,
        "kafka_bootstrap": services.kafka_bootstrap,
        "schema_name": f"toolledger_demo_{suffix}",
        "topic_prefix": f"demo-{suffix}.",
        "partitions": 2,
    }
    settings = load_settings(OperatorSettings, **shared, signing_keys=(key,))
    projecting = load_settings(ProjectorSettings, **shared, verify_keys=key.verify_keys())
    out = functools.partial(console.print, highlight=False, soft_wrap=True)
    out("# the demo's ledger; `toolledger replay --verify` or `executions list` read it with:")
    out(f"export TOOLLEDGER_DATABASE_URL={services.database_url}")
    out(f"export TOOLLEDGER_KAFKA_BOOTSTRAP={services.kafka_bootstrap}")
    out(f"export TOOLLEDGER_SCHEMA={settings.schema_name}")
    out(f"export TOOLLEDGER_TOPIC_PREFIX={settings.topic_prefix}")
    out(f"export TOOLLEDGER_VERIFY_KEYS={key.public_setting()}")
    out(f"export TOOLLEDGER_SIGNING_KEYS={signing}")
    try:
        async with await Ledger.connect(projecting, run_projector=True) as ledger:
            wrong = await billing_demo.run_scenarios(ledger, settings, console)
    finally:
        if not keep:
            await remove_namespace(services, (settings.schema_name,), settings.topic_prefix)
    if keep:
        out(f"kept schema {settings.schema_name} and topics {settings.topic_prefix}*")
    else:
        out(
            f"removed schema {settings.schema_name} and topics {settings.topic_prefix}* "
            "(--keep leaves them, to look at with the exports above)"
        )
    return wrong
