"""The JSON file store: application state as one JSON document, recorded to a recovery log.

`JSONFileStore` implements the consumer Store contract for small states: each commit writes
the whole state and its Checkpoint to ``next.json`` and renames it over ``state.json``, both
recorded through the shard's recovery log (docs/consumer-stores.md).
"""

from gazette.stores.jsonfile.store import (
    NEXT_FILE,
    STATE_FILE,
    JSONFileStore,
    decode_state_file,
    encode_state_file,
)

__all__ = [
    "NEXT_FILE",
    "STATE_FILE",
    "JSONFileStore",
    "decode_state_file",
    "encode_state_file",
]
