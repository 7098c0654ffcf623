"""Prometheus metrics of a server (issue 33, EXTENSIONS §13): what they count, from the
event log's records, and who may read them."""
