"""The operator HTTP API: settle what nobody can know automatically (`toolledger api`).

`create_app` builds the FastAPI application; `toolledger.api.service.OperatorService` is the
service layer it shares with the `toolledger executions` CLI; tokens live in
`toolledger.api.tokens`. See docs/architecture.md, "Security", for what the API signs and why.
"""

from toolledger.api.app import create_app

__all__ = ["create_app"]
