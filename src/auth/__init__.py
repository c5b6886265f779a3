"""Authorization and transport security shared by brokers, consumers and their clients:
upstream Gazette's JWT claims (`claims`, `jwt`, `keys`), their gRPC plumbing (`grpc_auth`),
and TLS settings (`tls`). docs/security.md states the design."""
