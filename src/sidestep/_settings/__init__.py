"""The configuration as data: pydantic models, durations and sizes, YAML loading, the
`observability:` and `store:` sections. Builds nothing."""
