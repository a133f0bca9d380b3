"""The operator HTTP API: settle what nobody can know automatically (`toolledger api`).

`create_app` builds the FastAPI application; `toolledger.api.service.OperatorService` is the
service layer it shares with the `toolledger executions` CLI; tokens live in
`toolledger.api.tokens`. See docs/architecture.md, "Security", for what the API signs and why.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolledger.api.app import create_app


def __getattr__(name: str) -> Any:
    # Loaded when asked for: `toolledger.api.tokens` and `toolledger.api.errors` are read by
    # commands whose `--help` must not import FastAPI.
    if name == "create_app":
        from toolledger.api.app import create_app

        return create_app
    raise AttributeError(f"module 'toolledger.api' has no attribute {name!r}")


__all__ = ["create_app"]
