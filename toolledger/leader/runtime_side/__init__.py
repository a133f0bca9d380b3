"""The leader's runtime side: what a runtime needs to ask partition leaders, and nothing more.

- `port`: `LeaderPort`, the runtime port on the fast path, over the direct path it falls back to.
- `connection`: `LeaderConnection` (one stream, many requests in flight) and `LeaderDirectory`
  (which leader holds a partition).
- `frames`: the wire format both sides speak, and what a request may carry.
- `tls`: the runtime's TLS, and the certificate checks settings run.

It imports nothing of the projector side, the projections or the wiring, so a runtime process
loads no projector code and no PostgreSQL driver for it (tests/unit/test_layers.py).
"""
