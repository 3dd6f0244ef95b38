"""The benchmarks' S3 server (`benchmarks/moto_ranged.py`): moto_server reading a ranged GET's
range alone answers every request as moto does, byte for byte, through boto3."""

from __future__ import annotations

import hashlib
import os
import random
import sys
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from moto_ranged import s3_server
from servers import FAKE_AWS_ENV


@pytest.fixture(scope="module")
def ranged_client(tmp_path_factory):
    server = s3_server("moto-ranged").start(log_dir=tmp_path_factory.mktemp("moto-ranged"))
    try:
        yield boto3.client(
            "s3",
            endpoint_url=server.url,
            aws_access_key_id=FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
            region_name=FAKE_AWS_ENV["AWS_DEFAULT_REGION"],
        )
    finally:
        server.stop()


def test_ranged_gets_whole_gets_and_errors_are_moto_s_answers(ranged_client, tmp_path):
    client = ranged_client
    client.create_bucket(Bucket="ranged-check")
    data = random.Random(3).randbytes(3 * 2**20 + 17)
    client.put_object(Bucket="ranged-check", Key="k", Body=data)

    assert client.get_object(Bucket="ranged-check", Key="k")["Body"].read() == data
    part = client.get_object(Bucket="ranged-check", Key="k", Range="bytes=1000-2999")
    assert part["ContentRange"] == f"bytes 1000-2999/{len(data)}" and part["Body"].read() == data[1000:3000]
    assert client.get_object(Bucket="ranged-check", Key="k", Range="bytes=-500")["Body"].read() == data[-500:]
    assert (
        client.get_object(Bucket="ranged-check", Key="k", Range=f"bytes={len(data) - 5}-")["Body"].read() == data[-5:]
    )
    # several ranges: answered whole, as moto (and S3) do
    assert client.get_object(Bucket="ranged-check", Key="k", Range="bytes=0-1,5-9")["Body"].read() == data
    with pytest.raises(ClientError, match="InvalidRange"):
        client.get_object(Bucket="ranged-check", Key="k", Range=f"bytes={len(data) + 5}-")
    out = tmp_path / "out"
    client.download_file("ranged-check", "k", str(out))  # boto3's managed download: ranged parts
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert os.path.getsize(out) == len(data)
