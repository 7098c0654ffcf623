"""The router <-> node gRPC protocol: ``kcoral_gateway.proto`` and its generated modules."""
