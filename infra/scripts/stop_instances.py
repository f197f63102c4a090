"""The autostop watcher's stop (autostop.sh stop_instances): ECS StopInstances through Alibaba's own Python SDK
(aliyun-python-sdk-core and aliyun-python-sdk-ecs, in the virtualenv autostop.sh install_sdk made on the head host).

Runs on the head host with the host's python3 (3.8 or newer), never inside the training container. Reads its
settings from the environment (autostop.sh documents each one):
  INSTANCE_IDS  space-separated ECS instance ids of this stack
  REGION_ID     their region
  RAM_ROLE      the head's instance RAM role: its temporary (STS) credentials come from the metadata service
  ECS_ENDPOINT  the ECS API endpoint (https://ecs.<region>.aliyuncs.com)
  METADATA_URL  the instance metadata service (http://100.100.100.200)
  STOPPED_MODE  StopCharging (economical mode), or KeepCharging for families without it (infra/economical.py)

BatchOptimization=SuccessFirst: ECS stops each instance on its own and answers for each one; with the default,
AllTogether, one instance that fails the check (a reclaimed spot worker) fails the whole call (Alibaba's ECS API,
StopInstances, BatchOptimization). Should ECS still refuse the whole call, each instance is asked for on its own.
An instance that no longer exists (InvalidInstanceId.NotFound) or is already stopping or stopped
(IncorrectInstanceStatus) needs nothing more. Prints Alibaba's answers (never the credentials); exits 0 when
nothing is left running that could be stopped, 1 otherwise (the watcher then fails and tries again).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
import urllib.request
from typing import Any

try:
    from aliyunsdkcore.acs_exception.exceptions import (  # type: ignore[import-not-found]
        ClientException,
        ServerException,
    )
    from aliyunsdkcore.auth.credentials import StsTokenCredential  # type: ignore[import-not-found]
    from aliyunsdkcore.client import AcsClient  # type: ignore[import-not-found]
    from aliyunsdkecs.request.v20140526.StopInstancesRequest import (  # type: ignore[import-not-found]
        StopInstancesRequest,
    )
except ImportError as missing:  # the virtualenv autostop.sh install_sdk makes; a step rerun makes it again
    raise SystemExit(f"stop_instances: Alibaba's SDK is missing from this Python ({missing}); run `pulumi up`, "
                     "whose autostop step installs it") from None

# Per-instance answers that leave nothing to stop: "200" is success (StopInstancesResponseBody InstanceResponse
# Code); the instance is gone; it is not Running (already Stopping or Stopped).
NOTHING_LEFT = ("200", "InvalidInstanceId.NotFound", "IncorrectInstanceStatus")
MAX_IDS_PER_CALL = 100  # "InstanceId.N: Valid values of N: 1 to 100" (StopInstances)


def say(text: str) -> None:
    print(f"stop_instances: {text}", flush=True)


def role_credentials(metadata_url: str, role: str) -> tuple[str, str, str]:
    """The role's temporary credentials: /latest/meta-data/ram/security-credentials/<role> (they rotate: read
    them for every stop)."""
    url = f"{metadata_url}/latest/meta-data/ram/security-credentials/{urllib.parse.quote(role, safe='')}"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            document = json.loads(answer.read().decode())
    except (OSError, ValueError) as error:
        raise SystemExit(f"stop_instances: no credentials for the instance RAM role {role} from the metadata "
                         f"service ({type(error).__name__}: {error})") from None
    values = tuple(str(document.get(name) or "") for name in ("AccessKeyId", "AccessKeySecret", "SecurityToken"))
    if not all(values):
        raise SystemExit(f"stop_instances: the metadata service's answer for role {role} lacks AccessKeyId, "
                         f"AccessKeySecret or SecurityToken (Code: {document.get('Code')!r})")
    return values[0], values[1], values[2]


def client_and_endpoint(endpoint: str, region: str, credentials: tuple[str, str, str]) -> tuple[Any, str, str]:
    url = urllib.parse.urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise SystemExit(f"stop_instances: ECS_ENDPOINT must be an http(s) URL; got {endpoint!r}")
    port = url.port or (443 if url.scheme == "https" else 80)
    client = AcsClient(region_id=region, credential=StsTokenCredential(*credentials), port=port,
                       connect_timeout=10, timeout=60)
    return client, url.hostname, url.scheme


def stop_request(ids: list[str], host: str, scheme: str, batch: bool) -> Any:
    request = StopInstancesRequest()
    request.set_InstanceIds(ids)
    request.set_StoppedMode(os.environ.get("STOPPED_MODE") or "StopCharging")
    if batch:
        request.set_BatchOptimization("SuccessFirst")
    request.set_endpoint(host)
    request.set_protocol_type(scheme)
    request.set_accept_format("JSON")
    return request


def answers_of(body: bytes, ids: list[str]) -> dict[str, str]:
    """Instance id -> ECS's code for it. A call without per-instance answers (AllTogether, or one id) that
    succeeded stopped all of them."""
    document = json.loads(body.decode() or "{}")
    listed = (document.get("InstanceResponses") or {}).get("InstanceResponse") or []
    codes = {str(item.get("InstanceId")): str(item.get("Code")) for item in listed}
    return {instance: codes.get(instance, "200" if not listed else "no answer") for instance in ids}


def stop_batch(client: Any, ids: list[str], host: str, scheme: str, batch: bool) -> dict[str, str]:
    try:
        body = client.do_action_with_exception(stop_request(ids, host, scheme, batch))
    except ServerException as error:
        say(f"ECS refused StopInstances for {' '.join(ids)}: {error.get_error_code()}: {error.get_error_msg()} "
            f"(HTTP {error.get_http_status()}, RequestId {error.get_request_id()})")
        code = str(error.get_error_code())
        # A refusal of several instances at once says nothing about each one (an unknown id refuses them all).
        return {instance: code if len(ids) == 1 else f"refused with the others ({code})" for instance in ids}
    except ClientException as error:
        say(f"StopInstances for {' '.join(ids)} did not reach ECS: {error.get_error_code()}: {error.get_error_msg()}")
        return {instance: "unreachable" for instance in ids}
    say(f"ECS answered StopInstances: {body.decode(errors='replace')}")
    return answers_of(body, ids)


def main() -> int:
    ids = os.environ.get("INSTANCE_IDS", "").split()
    region, role = os.environ.get("REGION_ID", ""), os.environ.get("RAM_ROLE", "")
    if not ids or not region or not role:
        raise SystemExit("stop_instances: INSTANCE_IDS, REGION_ID and RAM_ROLE are required")
    endpoint = os.environ.get("ECS_ENDPOINT") or f"https://ecs.{region}.aliyuncs.com"
    metadata_url = os.environ.get("METADATA_URL") or "http://100.100.100.200"
    client, host, scheme = client_and_endpoint(endpoint, region, role_credentials(metadata_url, role))
    mode = os.environ.get("STOPPED_MODE") or "StopCharging"
    say(f"StopInstances ({mode}, SuccessFirst) for {' '.join(ids)} in {region} with role {role}")
    results: dict[str, str] = {}
    for start in range(0, len(ids), MAX_IDS_PER_CALL):
        results.update(stop_batch(client, ids[start:start + MAX_IDS_PER_CALL], host, scheme, batch=True))
    refused = [instance for instance, code in results.items() if code not in NOTHING_LEFT]
    if refused and len(ids) > 1:
        # ECS refused the call as a whole (or answered nothing for some): each of those on its own, so that one
        # instance ECS cannot stop leaves none of the others running.
        for instance in refused:
            results.update(stop_batch(client, [instance], host, scheme, batch=False))
    for instance in ids:
        say(f"{instance}: {results[instance]}")
    left = [instance for instance in ids if results[instance] not in NOTHING_LEFT]
    if left:
        say(f"not stopped: {' '.join(left)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
