"""A job's training data, asked of the ingest service over HTTP with the caller's own key.

`training_file` names a dataset (`ds_...`, built already or building) or an uploaded file
(`file-...`), which becomes a dataset built by the existing builder, with `validation_file` as
its eval split. The caller's key travels with the request, so ingest checks it is the caller's
data; the scheduler keeps no key. What ingest refuses comes back as a JobError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from services.scheduler.jobs import JobError

DATASET_PREFIX = "ds_"
FILE_PREFIX = "file-"


@dataclass(frozen=True)
class DatasetRef:
    id: str
    status: str
    uri: str | None


def _ref(body: dict[str, Any]) -> DatasetRef:
    return DatasetRef(str(body["id"]), str(body["status"]), body.get("uri"))


def _refused(response: httpx.Response, param: str) -> JobError:
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = response.text[:500]
    status = response.status_code if response.status_code in (400, 404, 409, 422) else 400
    return JobError(status, f"{param}: {detail}", param=param)


async def resolve(
    client: httpx.AsyncClient,
    ingest_url: str,
    *,
    authorization: dict[str, str],
    job_id: str,
    model: str,
    training_file: str,
    validation_file: str | None,
) -> DatasetRef:
    """The dataset the job trains on; a file id starts a build (202 from ingest)."""
    if training_file.startswith(DATASET_PREFIX):
        if validation_file is not None:
            raise JobError(
                422,
                "validation_file: give it with an uploaded training file; a dataset id "
                "brings its own eval split",
                param="validation_file",
            )
        response = await client.get(
            f"{ingest_url}/v1/datasets/{training_file}", headers=authorization
        )
        if response.status_code != 200:
            raise _refused(response, "training_file")
        return _ref(response.json())
    if not training_file.startswith(FILE_PREFIX):
        raise JobError(
            422,
            f"training_file: {training_file!r} is neither a file id (file-...) nor a dataset "
            "id (ds_...)",
            param="training_file",
        )
    spec: dict[str, Any] = {
        "name": f"fine-tuning job {job_id}",
        "base_model": model,
        "file_ids": [training_file],
    }
    if validation_file is not None:
        spec["eval_file_ids"] = [validation_file]
    response = await client.post(f"{ingest_url}/v1/datasets", json=spec, headers=authorization)
    if response.status_code != 202:
        param = (
            "validation_file"
            if validation_file and validation_file in response.text
            else "training_file"
        )
        raise _refused(response, param)
    return _ref(response.json())
