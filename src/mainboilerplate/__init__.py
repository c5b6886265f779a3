"""What every Gazette process shares: the member processes' flags (`flags`) and life cycle
(`process`), and the Prometheus text exposition (`prometheus`)."""
