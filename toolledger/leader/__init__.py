"""The leader fast path: verdicts answered from memory, proven by Kafka's offsets.

The projector process that holds a partition's advisory lock also leads it: runtimes send it
the events they would have appended, it appends them in batches, and the acknowledged offsets
prove whether its in-memory fold is the fold of the log up to each record (then it answers at
once) or which foreign records it must fetch and fold first. The projection still commits
after the answers, in the projector's usual transaction. docs/architecture.md ("The leader
fast path") tells the design. The package is split by the process each side runs in:

- `runtime_side`: what a runtime needs to ask leaders: `LeaderPort`, its connections and
  directory, the wire format (`frames`) and the runtime's TLS. It imports nothing of the other
  side, of the projections or of the wiring.
- `projector_side`: the leader itself: `LeaderServer` (`listener`), the appender, the
  partition's fold with known provenance and its reads (`reads`), the leader's TLS.

Settings switch it on in `toolledger.wiring.leader` (a runtime's `LeaderPort`) and
`toolledger.wiring.projector_leader` (a projector's `LeaderServer`), the only places the rest of
the code meets it.
"""
