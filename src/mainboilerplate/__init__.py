"""What every Gazette process shares: the member processes' flags (`flags`), the etcd
endpoints they are given (`etcd_endpoints`), their life cycle (`process`), and the Prometheus
text exposition (`prometheus`)."""
