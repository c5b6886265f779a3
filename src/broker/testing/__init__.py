"""Real-component harnesses for tests, benchmarks and the demo: etcd, brokers, S3 (moto)."""
