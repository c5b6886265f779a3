"""gazctl: the command line of Gazette (journals ..., shards ...)."""
