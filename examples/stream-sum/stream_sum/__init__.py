"""stream-sum: exactly-once sums of many interleaved streams, the Python port of Gazette's
stream-sum example, and a check of the guarantees it relies on.

- `stream_sum.messages`: `Chunk` (what the chunker publishes), `Sum` (what the summer
  publishes), `RunningSum` (how chunks fold into a sum), and the journals they live in.
- `stream_sum.chunker`: the load generator: many concurrent streams of chunks, published
  committed to the chunk partitions, each stream's expected sum written to a record file.
- `stream_sum.app`: the `Summer` consumer application (``gazette-consumer
  stream_sum.app:Summer``): running sums in a SQLite store per shard, each finished stream's
  sum published exactly once, transactionally with the store.
- `stream_sum.record`: the chunker's record file (what it published, and where the sums
  journal stood before it began).
- `stream_sum.verifier`: reads the sums journal read-committed and checks it against records:
  every stream summed exactly once, to its expected sum.
- `stream_sum.specs`: the journal and shard specs of a deployment.

Put the directory holding this package (``examples/stream-sum``) on ``PYTHONPATH``.
"""
