"""Runnable example services that call LLM upstreams through sidestep."""
