"""Real-component harnesses for tests, benchmarks and demos: an etcd server (`etcd`), broker
and consumer processes (`broker`, `cluster`, `consumer`), an S3 API server (`s3`, moto),
the process harness they share (`process`), and hosts made of network namespaces (`netns`).

The harnesses run the components as processes (``python -m gazette.broker.main`` ...); they
import no other part of the package, so any layer's tests may use them.
"""
