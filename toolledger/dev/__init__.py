"""The servers the dev stack starts (`toolledger.devstack` decides which, and records them).

- `processes`: a started server as a `Service`, and stopping it by pid, never by name;
- `tansu`: the memory-only Kafka-compatible broker of the `dev-kafka` extra, the quick option;
- `apache`: Apache Kafka itself (KRaft, one node, data kept under `.toolledger/`), what `make
  test`, the drills and the benchmarks run on, from jars `maven` resolves from Maven Central.
"""
