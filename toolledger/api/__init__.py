"""The operator HTTP API: settle what nobody can know automatically (`toolledger api`).

`create_app` builds the FastAPI application; `toolledger.api.service.OperatorService` is the
service layer it shares with the `toolledger executions` CLI; tokens live in
`toolledger.api.tokens`. See docs/architecture.md, "Security", for what the API signs and why.
"""

from typing import TYPE_CHECKING, Any

from toolledger.extras import require

if TYPE_CHECKING:
    from toolledger.api.app import create_app


__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    """`create_app`, imported on first use: the operator service, tokens and errors (which the
    CLI uses) need no FastAPI, and a runtime-only install is told which extra to add."""
    if name == "create_app":
        require("server", "the operator API (toolledger.api.create_app)")
        from toolledger.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
