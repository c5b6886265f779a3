"""Fragments: codecs, the fragment index (CoverSet) and fragment stores (file://, s3://)."""
