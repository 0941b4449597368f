"""Drives a real `leash serve` through the Python client generated from
docs/openapi.json (openapi-python-client): upload plugins, submit a job
and wait for it, read its logs and attempts, cancel a running one. Run by
tests/clients.sh: python3 drive.py URL TOKEN PLUGINS_DIR (with the
generated package on PYTHONPATH)."""

import sys
import time

from leash_client import AuthenticatedClient
from leash_client.api.jobs import job_attempts, job_cancel, job_logs, job_output, job_show, job_submit
from leash_client.api.plugins import plugin_upload
from leash_client.models import Accepted, ErrorBody, Execution, JobStatus, SubmitRequest
from leash_client.types import File

url, token, plugins = sys.argv[1:4]
client = AuthenticatedClient(base_url=url, token=token, raise_on_unexpected_status=True)


def upload(name):
    with open(f"{plugins}/{name}.wasm", "rb") as component:
        info = plugin_upload.sync(client=client, body=File(payload=component), name=name)
    assert not isinstance(info, ErrorBody), info
    assert info.digest.startswith("sha256:"), info


def submit(**fields):
    accepted = job_submit.sync(client=client, body=SubmitRequest(execution=Execution.ASYNC, **fields))
    assert isinstance(accepted, Accepted), accepted
    return str(accepted.job_id)


def wait(id, until):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = job_show.sync(id, client=client)
        assert not isinstance(job, ErrorBody), job
        if until(job.status):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {id} never got there: {job}")


upload("hello")
upload("coop")

# Submit, wait, read the output, the logs and the one attempt.
id = submit(plugin="hello", input_={"name": "Py"})
job = wait(id, lambda s: s in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED))
assert job.status == JobStatus.SUCCEEDED, job
output = job_output.sync_detailed(id, client=client)
assert b"Hello, Py!" in output.content, output.content
logs = job_logs.sync(id, client=client)
assert any(r.message == "greeting Py" for r in logs.records), logs
attempts = job_attempts.sync(id, client=client)
assert [a.outcome for a in attempts.attempts] == ["succeeded"], attempts

# Cancel a running job.
id = submit(plugin="coop", input_={"steps": 1_000_000})
wait(id, lambda s: s == JobStatus.RUNNING)
answer = job_cancel.sync(id, client=client)
assert not isinstance(answer, ErrorBody), answer
job = wait(id, lambda s: s == JobStatus.CANCELLED)

# A refusal reads back as the API's error body.
missing = job_show.sync("01ARZ3NDEKTSV4RRFFQ69G5FAV", client=client)
assert isinstance(missing, ErrorBody) and missing.error.kind == "not_found", missing
print("the generated Python client: upload, submit, wait, output, logs, attempts, cancel, a 404: all as documented")
