"""Command line interface (``credo``)."""
