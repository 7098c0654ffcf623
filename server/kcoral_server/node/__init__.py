"""Node side of a routed deployment (ROUTER.md §5, §12): supervisor and slot tunnel."""
