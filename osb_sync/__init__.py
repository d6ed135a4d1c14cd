"""osb_sync: a synchronous, thread-safe client for OpenSandbox."""
