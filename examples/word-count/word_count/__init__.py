"""word-count: n-gram counts of a text stream, the Python port of Gazette's word-count example.

- `word_count.messages`: `NGramDelta` (what the feeder publishes) and `NGramCount` (what the
  shards publish), the journals they live in, and `ngrams` (how text splits into n-grams).
- `word_count.feed`: the feeder: text in, one committed `NGramDelta(ngram, 1)` per occurrence,
  mapped to a deltas partition by FNV-1a of the n-gram (so each shard owns disjoint n-grams).
- `word_count.app`: the `WordCount` consumer application (``gazette-consumer
  word_count.app:WordCount``): counts in a RocksDB store per shard, each changed count
  published exactly once, and the ``/wordcount.NGrams/Query`` gRPC method.
- `word_count.query`: a client of that method.
- `word_count.specs`: the journal and shard specs of a deployment.

Put the directory holding this package (``examples/word-count``) on ``PYTHONPATH``.
"""
