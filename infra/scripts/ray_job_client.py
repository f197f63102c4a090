"""The Jobs API client of the job steps (ray_common.sh job_client): the same public JobSubmissionClient that
`ray job` wraps. `ray job submit -- CMD` joins CMD with Windows quoting (subprocess.list2cmdline) and hands the
result to /bin/sh, which expands `$`, backquotes and backslashes in it; submitting the entrypoint string through the
client keeps it exactly as the user wrote it.

Runs in the head's container with its python3 (`docker exec -i ... python3 - ACTION JOB_ID < ray_job_client.py`),
with RAY_JOB_API (the dashboard URL):
  ping     the Jobs API answers
  state    prints the job's status, or NOT_FOUND
  submit   submits JOB_ENTRYPOINT (run from JOB_WORKDIR with bash) with JOB_RUNTIME_ENV_JSON
  logs     prints the job's log
  message  prints the job's status message (why it failed)
  delete   deletes a job that has ended, so that its id can be submitted again
  stop     asks Ray to stop the job (it returns at once; the state turns STOPPED)
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any

from ray.job_submission import JobSubmissionClient  # type: ignore[import-not-found]


def submit(client: Any, job_id: str) -> None:
    runtime_env = json.loads(os.environ.get("JOB_RUNTIME_ENV_JSON") or "{}")
    command = "exec bash -c " + shlex.quote(os.environ["JOB_ENTRYPOINT"])
    if "working_dir" not in runtime_env:
        # Ray runs the entrypoint from its own directory; with a working_dir it runs from the unpacked copy.
        command = "cd " + shlex.quote(os.environ["JOB_WORKDIR"]) + " && " + command
    if os.environ.get("JOB_HEAD_IP"):
        # The entrypoint may name the head by ROLL_CLUSTER_HEAD_IP (the OpenRLHF reward URL): set for its shell only.
        command = "export ROLL_CLUSTER_HEAD_IP=" + shlex.quote(os.environ["JOB_HEAD_IP"]) + " && " + command
    resume = os.environ.get("JOB_RESUME_FROM", "")
    if resume:
        # The newest complete checkpoint the job step found (job_submit.sh find_checkpoint): the entrypoint hands it
        # to the framework; the metadata lets jobStatus say where the job resumed from.
        command = "export ROLL_CLUSTER_RESUME_FROM=" + shlex.quote(resume) + " && " + command
    client.submit_job(entrypoint=command, submission_id=job_id, runtime_env=runtime_env or None,
                      metadata={"roll_cluster.resume_from": resume or "fresh"})


def main() -> None:
    action, job_id = sys.argv[1], sys.argv[2]
    client = JobSubmissionClient(os.environ["RAY_JOB_API"])
    if action == "ping":
        client.list_jobs()
    elif action == "state":
        states = [str(job.status.value) for job in client.list_jobs() if job.submission_id == job_id]
        print(states[-1] if states else "NOT_FOUND")
    elif action == "logs":
        sys.stdout.write(client.get_job_logs(job_id))
    elif action == "message":
        print(client.get_job_info(job_id).message or "")
    elif action == "delete":
        client.delete_job(job_id)
    elif action == "stop":
        client.stop_job(job_id)
    elif action == "submit":
        submit(client, job_id)
    else:
        sys.exit("unknown action " + action)


if __name__ == "__main__":
    main()
