"""At the time-limit warning or a preemption: ask every training run on the job's Ray cluster to checkpoint and stop.

Runs in the batch step on the head node, before Ray is torn down. Jobs submitted with `ray job submit` are not
resubmitted automatically: the cluster that comes back (if any) is a new allocation the submitter may not be
watching, and their working directory was uploaded from a checkout only the submitter has. Instead the job
output names each interrupted run with the exact command that resumes it (same run.name and storage: the run
continues at the step it checkpointed).
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable

from raydist.cluster.connection import Connection

RUNNING = ("PENDING", "RUNNING")
LIST_WITHIN_S = 20.0  # how long the job API may take to answer before the runs go unnamed


def ray_env(conn: Connection) -> dict[str, str]:
    """What a driver on a node of this cluster needs: the GCS address and the job's token."""
    return {"RAY_ADDRESS": conn.gcs_address, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": conn.token_path}


def _jobs_client(conn: Connection):
    from ray.job_submission import JobSubmissionClient

    token = open(conn.token_path).read().strip()
    return JobSubmissionClient(conn.dashboard_url, headers={"Authorization": f"Bearer {token}"})


def running_submissions(conn: Connection) -> list:
    """Jobs submitted with `ray job submit` that have not ended; raises what the dashboard's job API raised."""
    return [
        j
        for j in _jobs_client(conn).list_jobs()
        if str(getattr(j, "type", "")).endswith("SUBMISSION") and str(j.status).split(".")[-1] in RUNNING
    ]


def _listed(conn: Connection, until: float, pause_s: float = 1.0) -> tuple[list, str | None]:
    """The running submissions, asked again until `until` (monotonic) while the dashboard does not answer: a
    loaded head, or one that just lost a node, can fail a request now and answer the next. (jobs, the last error)"""
    while True:
        try:
            return running_submissions(conn), None
        except Exception as e:  # noqa: BLE001 - any failure of the job API is the same to the user: not listed
            error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        if time.monotonic() + pause_s >= until:
            return [], error
        time.sleep(pause_s)


def resume_command(entrypoint: str) -> str:
    return f"ray job submit --working-dir <your checkout> -- {entrypoint}"


def stop_cluster_runs(
    conn: Connection,
    reason: str,
    deadline_s: float | None,
    wait_s: float,
    still_running: Callable[[], bool] = lambda: False,
    log: Callable[[str], None] = print,
) -> float:
    """Set the stop request (raydist.cluster.preemption), then wait until the cluster's submitted jobs and `still_running`
    are done, at most `wait_s`; names every interrupted submission with its resume command. Returns the seconds
    waited."""
    os.environ.update(ray_env(conn))  # before Ray is imported: it reads its auth settings once, at import
    import ray

    from raydist.cluster.preemption import request_stop

    started = time.monotonic()
    ray.init(address=conn.gcs_address, log_to_driver=False, logging_level="ERROR")
    try:
        drained = request_stop(reason, deadline_s)
        log(
            f"{reason}: asked every training run to checkpoint and stop; drained "
            f"{', '.join(addr for addr, ok in drained if ok) or 'no node (head only)'}"
        )
        submissions, error = _listed(conn, until=started + min(wait_s, LIST_WITHIN_S))
        if error:
            log(
                f"could not list the submitted jobs ({error}): each one asked to stop resumes with the command "
                "that submitted it"
            )
        for job in submissions:
            log(f"interrupted {job.submission_id}; resume with: {resume_command(job.entrypoint)}")
        ids = {j.submission_id for j in submissions}
        while time.monotonic() - started < wait_s:
            left, _ = _listed(conn, until=0)  # one try: a failed listing counts as none left
            if not [j for j in left if j.submission_id in ids] and not still_running():
                break
            time.sleep(0.5)
        return time.monotonic() - started
    finally:
        ray.shutdown()


def quoted(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
