"""The I/O shells: the sync and async transports that perform the core's effects, and
wrap()/install(), which put them under a program's clients."""
