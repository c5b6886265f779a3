"""Client library of the broker protocol: readers, appenders and listing helpers."""
