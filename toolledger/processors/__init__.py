"""faust processors over the facts topic: the reconciler, the resumer, analytics.

`DEFAULT_SESSION_TIMEOUT_S` lives here, not beside the faust app, so the commands can show it
as their default without importing faust (`toolledger --help` must stay light).
"""

#: Session timeout against the development broker: 2-6 s is what docs/architecture.md asks for.
DEFAULT_SESSION_TIMEOUT_S = 3.0
