"""The router's side of its nodes (ROUTER §2–§5): the gRPC gateway, node records and
their slots, and the frames and channels a slot carries."""
