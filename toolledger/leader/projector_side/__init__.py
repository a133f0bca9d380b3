"""The leader's projector side: the leader itself, in the projector process that holds a
partition's lock.

- `listener`: `LeaderServer`, which listens, routes requests and follows the projector.
- `appender`: batching, one produce per batch, the offset proof, the gap fetch.
- `partition`: the pure fold with known provenance that the proof rests on.
- `reads`: `LeaderReads`, rows read with the partition's stored offset, and registration.
- `tls`: the leader's TLS context.

It may import the runtime side (the frames it answers, the TLS constants); never the reverse.
"""
