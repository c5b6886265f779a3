"""Real-component harnesses for tests, benchmarks and the demo: an etcd server and broker processes."""
