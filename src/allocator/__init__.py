"""The etcd keyspace mirror and the assignment machinery shared by brokers and consumers."""
