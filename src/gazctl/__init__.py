"""gazctl: the command line of Gazette (journals ..., shards ...).

gRPC's fork handlers are switched off before gazctl imports gRPC (unless the environment says
otherwise): ``shards export`` and ``journals export`` start Spark, whose JVM gateway is
launched by a fork of this process after it has made gRPC calls, and a fork while a gRPC
thread is busy can leave the child's descriptors broken, so that the gateway never reports
its port. gazctl forks nothing that uses gRPC."""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
