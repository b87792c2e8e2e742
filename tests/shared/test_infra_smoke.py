"""The real servers the fixtures start answer like the real thing."""

import nats
from minio import Minio

from tests.plugins.infra import RunningProcess


async def test_nats_server_has_jetstream(nats_server: RunningProcess, stack_settings) -> None:
    nc = await nats.connect(stack_settings.nats.url)
    try:
        info = await nc.jetstream().account_info()
        assert info.limits is not None
    finally:
        await nc.close()


def test_s3_server_accepts_the_configured_credentials(
    s3_server: RunningProcess, stack_settings
) -> None:
    s3 = stack_settings.s3
    client = Minio(
        s3.endpoint,
        access_key=s3.access_key,
        secret_key=s3.secret_key.get_secret_value(),
        secure=False,
    )
    bucket = "smoke-bucket"
    if not client.bucket_exists(bucket):
        client.make_bucket(bucket)
    assert bucket in [b.name for b in client.list_buckets()]
