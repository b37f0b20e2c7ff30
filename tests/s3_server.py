"""moto's S3 server on 127.0.0.1 for tests of ``s3://`` URLs: a real endpoint that fsspec (s3fs) and boto3 reach
through the environment, as a user's would be configured."""

import os
from contextlib import contextmanager

import pytest


@contextmanager
def moto_s3():
    """Start moto's S3 server on a free port of 127.0.0.1, set ``AWS_ENDPOINT_URL`` and test credentials in the
    environment, and yield a boto3 client of it; on exit the environment is restored and the server stopped. The
    test skips, saying why, where moto[server] (the dev extra) is missing."""
    server_module = pytest.importorskip("moto.server", reason="moto[server] (the dev extra) is the local S3")
    import boto3

    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _forget_filesystems()  # fsspec keeps one S3 filesystem a process, with the endpoint it was made with
    try:
        yield boto3.client("s3")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
        _forget_filesystems()


def _forget_filesystems() -> None:
    """Drop the S3 filesystems fsspec and mmfeed's range cache keep, so the next ones are made with the endpoint
    now set (an earlier test's server, stopped since, would otherwise be asked again)."""
    from mmfeed.loaders.transport.remote import reset_default_cache

    reset_default_cache()
    try:
        import s3fs
    except ImportError:
        return
    s3fs.S3FileSystem.clear_instance_cache()
