"""The recovery log: a journal recording every operation on a directory of files.

A Recorder appends file operations (create, write, link, unlink) as `RecordedOp`s; a Player
reads them back into a directory. The sans-I/O `FSM` validates the sequence of operations (seq
numbers, a CRC-32C checksum chain, authors) and tracks live files and the log Segments holding
them, from which `FSMHints` let a Player skip dead portions of the log.
"""
