"""Development tools, never imported by the program: the offline cloud (Pulumi mocks that answer like Alibaba
Cloud), the offline plan, the schedule model and the configuration reference generator."""
