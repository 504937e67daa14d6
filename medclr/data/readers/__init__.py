"""Dataset readers: each returns a manifest DataFrame (see medclr.data.manifest)."""
