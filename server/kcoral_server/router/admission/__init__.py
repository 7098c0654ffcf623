"""Which node and slot a request gets, and when (ROUTER §7): the admission queue, the
identities' shares and the nodes a selector allows."""
