"""The result store and run identity, read by reports/ and written by runners (no torch)."""
