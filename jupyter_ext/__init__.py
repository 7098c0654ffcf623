"""Jupyter integration for KCoral (IPython magics, rich display, server extension)."""
