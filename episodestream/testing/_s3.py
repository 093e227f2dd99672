"""An S3 endpoint on 127.0.0.1 (moto's server) with helpers to fill it and point fsspec at it."""

from __future__ import annotations

import logging
import os
import threading
import urllib.request
from pathlib import Path

# moto accepts any key pair; these are not credentials for anything.
_ACCESS_KEY_ID = "testing"
_SECRET_ACCESS_KEY = "testing"
_REGION = "us-east-1"
_INSTALL_HINT = "pip install 'moto[s3]>=5' flask flask-cors"


class S3Server:
    """moto's S3 application served on 127.0.0.1 and a free port, with fake credentials.

    Start and stop with ``with S3Server() as s3: s3.url`` or ``start()`` / ``stop()``. moto keeps its
    buckets in process-wide state, so servers running at the same time in one process share them;
    ``stop()`` of the last running server clears that state (and the memory it holds).

    Nothing here touches ``os.environ``: pass ``storage_options()`` to fsspec/s3fs, or ``env()`` to a
    subprocess.
    """

    _running = 0  # servers started and not stopped in this process

    def __init__(self) -> None:
        self._server = None
        self._thread: threading.Thread | None = None
        self._url: str | None = None

    def start(self) -> S3Server:
        if self._server is not None:
            raise RuntimeError("S3Server is already running.")
        try:
            from moto.server import DomainDispatcherApplication, create_backend_app
            from werkzeug.serving import make_server
        except ImportError as error:
            raise ImportError(f"S3Server needs moto's S3 server: {_INSTALL_HINT}") from error
        werkzeug_logger = logging.getLogger("werkzeug")
        if werkzeug_logger.level == logging.NOTSET:
            # werkzeug prints a line per request unless its logger is configured; tests want quiet.
            werkzeug_logger.setLevel(logging.WARNING)
        # The application moto's ThreadedMotoServer serves, on a server of our own: that one serves
        # with the default 0.5 s poll interval, so every stop waited up to half a second.
        server = make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app), threaded=True)
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="episodestream-s3-server", daemon=True)
        self._thread.start()
        self._server, self._url = server, f"http://127.0.0.1:{server.server_address[1]}"
        S3Server._running += 1
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        if S3Server._running == 1:
            self.reset()
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()
        S3Server._running -= 1
        self._server, self._thread, self._url = None, None, None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("S3Server is not running: use `with S3Server() as s3` or call start().")
        return self._url

    def reset(self) -> None:
        """Delete every bucket and object in moto's (process-wide) state."""
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def storage_options(self) -> dict:
        """Options for fsspec/s3fs: ``fsspec.filesystem("s3", **s3.storage_options())``."""
        return {
            "key": _ACCESS_KEY_ID,
            "secret": _SECRET_ACCESS_KEY,
            "client_kwargs": {"endpoint_url": self.url, "region_name": _REGION},
            # A bucket in the host name (virtual-hosted style) cannot resolve on 127.0.0.1.
            "config_kwargs": {"s3": {"addressing_style": "path"}},
        }

    def env(self) -> dict[str, str]:
        """Environment variables that point AWS SDKs at this server (for a subprocess's ``env=``)."""
        return {"AWS_ACCESS_KEY_ID": _ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": _SECRET_ACCESS_KEY,
                "AWS_DEFAULT_REGION": _REGION, "AWS_REGION": _REGION, "AWS_ENDPOINT_URL": self.url}

    def client(self):
        """A boto3 S3 client for this server."""
        try:
            import boto3
            from botocore.config import Config
        except ImportError as error:
            raise ImportError("S3Server.client() needs boto3: pip install boto3") from error
        return boto3.session.Session().client(
            "s3", endpoint_url=self.url, region_name=_REGION, aws_access_key_id=_ACCESS_KEY_ID,
            aws_secret_access_key=_SECRET_ACCESS_KEY, config=Config(s3={"addressing_style": "path"}))

    def upload_folder(self, local_root: str | Path, bucket: str, prefix: str = "") -> list[str]:
        """Upload every file below ``local_root`` to ``s3://bucket/prefix/<relative path>``, creating
        the bucket if needed. Returns the keys written, sorted."""
        if len(bucket) < 3:
            raise ValueError(f"Invalid bucket ({bucket!r}): S3 bucket names need 3 to 63 characters.")
        local_root = Path(local_root)
        client = self.client()
        if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
            client.create_bucket(Bucket=bucket)
        keys = []
        for path in sorted(p for p in local_root.rglob("*") if p.is_file()):
            key = "/".join(part for part in (prefix.strip("/"), path.relative_to(local_root).as_posix()) if part)
            client.upload_file(os.fspath(path), bucket, key)
            keys.append(key)
        return keys
