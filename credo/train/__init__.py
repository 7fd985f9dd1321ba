"""Training loop pieces: metrics logging, and (added by later modules) the trainer itself."""
