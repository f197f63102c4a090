"""Pulumi ComponentResources of roll-cluster; each takes a typed args object."""
