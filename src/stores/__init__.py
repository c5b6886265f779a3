"""Embedded stores whose files are recorded into recovery logs: `rocksdb` (on a fusefs mount),
`sqlite` (through a recording VFS), `jsonfile` (one JSON document), and `sqlstore` (a remote
SQL database with a fenced checkpoint row). Each implements `gazette.consumer.Store` and
registers how an export reads it (`gazette.consumer.export`)."""
