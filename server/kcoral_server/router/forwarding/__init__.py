"""Streaming a client request through a node slot and its answer back (ROUTER §8): the
handlers, which headers cross, and what the router learns of the client's connection."""
