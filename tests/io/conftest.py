"""A real S3 API on 127.0.0.1 for the object-store tests: moto's server mode.

Dummy credentials are set when this file is imported, before the session's
Spark starts, so that Spark's Python workers (which get the JVM's environment)
sign their requests with them too; the instance-metadata lookup is off. The
endpoint reaches the workers inside the pickled pyarrow filesystem.
"""

from __future__ import annotations

import os
import socket
import uuid

import pytest

for _k, _v in {"AWS_ACCESS_KEY_ID": "sparkpriv-test", "AWS_SECRET_ACCESS_KEY": "sparkpriv-test",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
    os.environ.setdefault(_k, _v)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint():
    """``127.0.0.1:port`` of a moto S3 server running for the whole session."""
    pytest.importorskip("moto", reason="moto[server] is in the test extra")
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop()


class Bucket:
    """A fresh bucket: its URIs for sparkpriv, and independent views for the checks."""

    def __init__(self, endpoint: str):
        import boto3
        from pyarrow import fs

        self.name = f"sparkpriv-{uuid.uuid4().hex[:12]}"
        self.query = f"endpoint_override={endpoint}&scheme=http&region=us-east-1"
        self.fs = fs.S3FileSystem(endpoint_override=endpoint, scheme="http", region="us-east-1",
                                  access_key="sparkpriv-test", secret_key="sparkpriv-test")
        self.client = boto3.client("s3", endpoint_url=f"http://{endpoint}", region_name="us-east-1",
                                   aws_access_key_id="sparkpriv-test", aws_secret_access_key="sparkpriv-test")
        self.client.create_bucket(Bucket=self.name)

    def uri(self, key: str) -> str:
        """What a user passes: ``s3://bucket/key?endpoint_override=...``."""
        return f"s3://{self.name}/{key}?{self.query}"

    def keys(self) -> list[str]:
        """Every object in the bucket (directory markers included), from boto3's listing."""
        out, token = [], None
        while True:
            kw = {"Bucket": self.name, **({"ContinuationToken": token} if token else {})}
            r = self.client.list_objects_v2(**kw)
            out += [o["Key"] for o in r.get("Contents", [])]
            if not r.get("IsTruncated"):
                return sorted(out)
            token = r["NextContinuationToken"]

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()


@pytest.fixture
def bucket(s3_endpoint):
    return Bucket(s3_endpoint)
