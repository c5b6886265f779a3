"""Journal brokers: the gRPC `protocol.Journal` service, spools, fragments and fragment stores.

A journal is an append-only byte stream. Brokers accept transactional appends into a local
*spool*, roll spools into *fragments* persisted to fragment stores (file://, s3://), and serve
reads from spools and stores alike. Journal specs live in etcd.
"""
