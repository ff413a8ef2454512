"""A FastAPI chat service over two OpenAI-compatible upstreams; see its README."""
