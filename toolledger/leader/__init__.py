"""The leader fast path: verdicts answered from memory, proven by Kafka's offsets.

The projector process that holds a partition's advisory lock also leads it: runtimes send it
the events they would have appended, it appends them in batches, and the acknowledged offsets
prove whether its in-memory fold is the fold of the log up to each record (then it answers at
once) or which foreign records it must fetch and fold first. The projection still commits
after the answers, in the projector's usual transaction. docs/architecture.md ("The leader
fast path") tells the design; the modules, in the order a request meets them:

- `frames`: the wire format (length-prefixed frames, request ids, many in flight).
- `runtime_port`, `client`: the runtime's `LeaderPort` and its connections and directory.
- `server`: the leader in the projector process, its access rules and routing.
- `appender`: batching, one produce per batch, the offset proof, the gap fetch.
- `partition`: the pure fold with known provenance that the proof rests on.
- `provenance`: rows read with the partition's stored offset; the leader's registration.

Settings switch it on in `toolledger.wiring.leader`, the one place the rest of the code meets it.
"""
