"""Launches: the dispatchers that start worker groups, the lifecycle, and LaunchService."""
