"""`toolledger api`: serve the operator HTTP API with uvicorn.

The ledger stack is opened by the app's startup, inside uvicorn's event loop, and closed at
shutdown. This process appends operator commands and reads the ledger; it runs no projector
(run `toolledger projector` alongside) and creates no topics. `--tools` names the modules
declaring the toolsets whose compensations it may run; without them, compensation requests
are refused with a message saying so. It reads the operator role's settings
(`OperatorSettings`: the private signing key). Prometheus metrics are served at `/metrics` to
requests bearing `TOOLLEDGER_METRICS_TOKEN` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from toolledger.extras import API, require

if TYPE_CHECKING:
    from toolledger.wiring.stack import LedgerStack


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option(
    "--tools",
    "tools",
    multiple=True,
    envvar="TOOLLEDGER_TOOLS",
    help="Module declaring toolsets whose compensations this API runs (repeatable); it must be "
    "importable here: installed, or a package under the working directory [env TOOLLEDGER_TOOLS].",
)
@click.option("--log-level", default="info", show_default=True, help="uvicorn's log level.")
def api(host: str, port: int, tools: tuple[str, ...], log_level: str) -> None:
    """Serve the operator HTTP API (OpenAPI at /openapi.json), configured by TOOLLEDGER_*."""
    require("server", "this command", API)
    import uvicorn

    from toolledger.api.app import create_app
    from toolledger.api.compensation import load_tools
    from toolledger.settings import OperatorSettings, load_settings
    from toolledger.wiring.stack import LedgerStack

    registry = load_tools(tools) if tools else None
    settings = load_settings(OperatorSettings)
    settings.require_services()
    settings.require_signing_key()

    async def open_stack() -> LedgerStack:
        return await LedgerStack.connect(settings, create_topics=False)

    app = create_app(open_stack, settings, tools=registry)
    uvicorn.run(app, host=host, port=port, log_level=log_level, lifespan="on")
