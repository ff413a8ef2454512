"""What every layer shares: the error tree, scope keys and credential names, turns for
other threads during long work, and async work carried to its end whatever cancels its
caller. Imports nothing else of sidestep."""
