"""What every Gazette process shares: the Prometheus text exposition (`prometheus`)."""
