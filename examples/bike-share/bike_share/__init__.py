"""bike-share: per-station state of a city's bike rides, kept in SQLite and queried over HTTP.

See examples/bike-share/README.md."""
