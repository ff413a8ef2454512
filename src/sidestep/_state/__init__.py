"""Circuit state: the pure state machine, the store protocol, the memory store every
store reuses, one folder per shared store (which never import each other), and the
store built from its settings."""
