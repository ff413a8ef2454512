"""The sans-I/O core: request -> route -> candidates -> admission -> rewrite -> send ->
classify -> record -> response or next candidate. Decides; never performs I/O."""
