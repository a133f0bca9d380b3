"""`toolledger server`: every server role as one deployable command.

`serve` runs the projector and the operator API in its own process and the faust processors
(reconciler, resumer) as supervised children (`children`).
"""
