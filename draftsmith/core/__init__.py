"""The bottom layer: sampling, KV-cache helpers, loading a local model, typed-config plumbing,
confidence signals with the acceptance-model protocol, and the frozen `Target`. Imports nothing
else of draftsmith."""
