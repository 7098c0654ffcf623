"""The KCoral wire format, implemented once and used by both client and server."""
