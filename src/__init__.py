"""Gazette in Python: journal brokers, exactly-once messages, and consumers whose embedded
stores are recorded into journals.

The packages, from the bottom layer up (docs/architecture.md):

- `gazette.broker.protocol`, `gazette.broker.fragment`, `gazette.broker.client`: the wire
  protocol, fragment stores and the client library;
- `gazette.keyspace`, `gazette.allocator`: the etcd keyspace and the assignment solver;
- `gazette.broker`: journal brokers; `gazette.message`: exactly-once messages;
- `gazette.recoverylog`: the recorded file-operation log; `gazette.fusefs`: its FUSE recorder;
- `gazette.consumer`: the consumer runtime; `gazette.stores.*`: its embedded stores;
- `gazette.gazctl`: the command line.
"""
