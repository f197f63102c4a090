"""The `alibaba` node source's resources: the network, the login key pair, the NAS, the GPU nodes, the baked image
and the autostop RAM role (cluster.py composes them; infra/sources/alibaba/ decides what they are)."""
