"""RedisStore: circuit state shared across hosts through Redis (or Redis Cluster)."""
