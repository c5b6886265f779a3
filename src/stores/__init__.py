"""Embedded stores whose files are recorded into recovery logs (`stores.sqlite`)."""
