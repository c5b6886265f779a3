"""Fragments: codecs, the fragment index (CoverSet) and fragment stores (file://, s3://).

- `codecs`: streaming (de)compression by `CompressionCodec`, byte-compatible with Gazette.
- `coverset`: `FragmentEntry` and `CoverSet`, the sans-I/O index of a journal's fragments.
- `postfix`: evaluation of `path_postfix_template` (the Go-template forms used upstream).
- `store`: the `FragmentStore` protocol, its errors, and `store_for_url`;
  `store_file` and `store_s3` implement it.

Submodules are imported explicitly (``from gazette.broker.fragment.store import
store_for_url``) so that importing the package does not pull in boto3.
"""
