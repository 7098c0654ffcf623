"""The KCoral router (ROUTER.md): HTTP front for clients, gRPC gateway for nodes."""
