"""A Flask chat service over two OpenAI-compatible upstreams; see its README."""
