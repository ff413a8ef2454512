"""What every layer shares: the error tree, scope keys and credential names, and turns
for other threads during long work. Imports nothing else of sidestep."""
