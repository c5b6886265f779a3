"""The consumer protocol of Gazette: generated messages of ``proto/consumer.proto``.

`pb` (the generated module `consumer_pb2`) holds the messages and enums (ShardSpec,
ConsumerSpec, ReplicaStatus, Checkpoint, and the requests and responses of the ``consumer.Shard``
service), wire-compatible with upstream's ``consumer/protocol/protocol.proto``. They refer to
broker messages (``protocol.Header``, ``protocol.LabelSet``, ...) of `broker.protocol.pb` and to
``recoverylog.FSMHints``. The gRPC stubs are in `consumer.protocol.consumer_pb2_grpc`.
"""

from gazette.consumer.protocol import consumer_pb2 as pb

__all__ = ["pb"]
