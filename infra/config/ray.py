"""`roll-cluster:ray`: the ports and timeouts of the Ray cluster the containers form."""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator

from infra.config.base import KeyPath, Section, _problem, _Problems

RAY_PORT_KEYS = ("gcsPort", "dashboardPort", "clientPort")
# Ports Ray binds on every node besides the three above, at Ray 2.x defaults (ray/_private/ray_constants.py,
# DEFAULT_DASHBOARD_AGENT_LISTEN_PORT = 52365).
RAY_FIXED_PORTS = {52365: "Ray's dashboard agent"}


class RayConfig(Section):
    gcs_port: int = Field(
        6379, ge=1, le=65535,
        description="Ray GCS port (workers join here). The three Ray ports differ from each other and from 22.",
    )
    dashboard_port: int = Field(8265, ge=1, le=65535, description="Ray dashboard and Jobs API port.")
    client_port: int = Field(10001, ge=1, le=65535, description="Ray Client server port.")
    ready_timeout_seconds: int = Field(
        900, ge=30, le=7200, description="How long the readiness gate waits for all nodes and GPUs to join."
    )
    head_wait_timeout_seconds: int = Field(
        900, ge=10, le=7200,
        description="How long a worker waits for the head's GCS port before its join fails (naming the address).",
    )
    object_store_memory_gb: float | None = Field(
        None, ge=0.1, le=4096,
        description="Ray object store per node in GB; it lives in /dev/shm, so it must fit in container.shmSize "
        "(checked). null: Ray's default, 30% of the node's memory.",
    )

    @field_validator("gcs_port", "dashboard_port", "client_port")
    @classmethod
    def _not_ssh(cls, port: int) -> int:
        if port == 22:
            raise _problem("must not be 22, the nodes' SSH port; got 22")
        if port in RAY_FIXED_PORTS:
            raise _problem(f"must not be {port}, the port of {RAY_FIXED_PORTS[port]} on every node; got {port}")
        return port

    @field_validator("client_port")
    @classmethod
    def _distinct(cls, client_port: int, info: ValidationInfo) -> int:
        # clientPort is the last port declared: info.data holds the valid ones before it.
        ports = [
            (key, info.data.get(name) if name != "client_port" else client_port)
            for key, name in zip(RAY_PORT_KEYS, ("gcs_port", "dashboard_port", "client_port"), strict=True)
        ]
        problems: list[tuple[KeyPath, str]] = []
        for index, (key, port) in enumerate(ports):
            clash = next((other for other, used in ports[:index] if port is not None and used == port), None)
            if clash is not None:
                problems.append((
                    ("..", key),
                    f"must be distinct from {clash} (gcsPort, dashboardPort and clientPort are separate "
                    f"listeners); got {port} for both",
                ))
        if problems:
            raise _Problems(*problems)
        return client_port
