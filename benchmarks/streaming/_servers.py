"""The benchmark's remote sources: a local dataset folder served from 127.0.0.1 by ``FakeHub`` (the
Hub's HTTP API) or ``S3Server`` (moto), behind ``ShapingProxy`` links that add a delay before every
request and cap the bandwidth of all connections together, as a far-away object store would.

    with serve("hub", root, latency_s=0.05, rate_bytes_per_s=50e6) as remote:
        EpisodeStreamingDataset(remote.source, cache_dir=..., **remote.options)

``hub`` may answer ``/resolve/`` with a redirect to a second origin (the Hub's CDN); both origins are
shaped alike, and the bytes flow through the second one. Everything runs in this process's threads,
so its CPU is the benchmark machine's (a real store's is not).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from episodestream.testing import FakeHub, LinkSettings, S3Server, ShapingProxy

REMOTE_KINDS = ("hub", "bucket", "warmed_bucket")
HUB_OWNER = "bench"
BUCKET = "episodestream-bench"


@dataclass
class RemoteSource:
    """A served dataset: what to pass to the dataset (``source``, ``options``) and the links' counters."""

    kind: str
    source: str
    options: dict
    proxies: list[ShapingProxy] = field(default_factory=list)

    def reset_link_stats(self) -> None:
        for proxy in self.proxies:
            proxy.reset_stats()

    def link_stats(self) -> dict[str, int]:
        """Requests and response body bytes through the shaped links since the last reset."""
        stats = [proxy.stats() for proxy in self.proxies]
        return {"requests": sum(s.requests for s in stats), "bytes": sum(s.bytes_sent for s in stats)}


def _link(stack: ExitStack, upstream_url: str, settings: LinkSettings) -> ShapingProxy:
    return stack.enter_context(ShapingProxy(upstream_url, settings=settings))


@contextmanager
def serve(kind: str, root: str | os.PathLike, *, latency_s: float, rate_bytes_per_s: float | None,
          hub_redirect: bool = False) -> Iterator[RemoteSource]:
    """Serve the dataset folder ``root`` as ``kind`` (one of ``REMOTE_KINDS``) until the block ends."""
    if kind not in REMOTE_KINDS:
        raise ValueError(f"Invalid kind ({kind!r}). Supported values are {', '.join(REMOTE_KINDS)}.")
    settings = LinkSettings(latency_s=latency_s, rate_bytes_per_s=rate_bytes_per_s)
    name = Path(root).name
    with ExitStack() as stack:
        if kind == "hub":
            # huggingface_hub reads these when first imported: no telemetry, no Xet, nothing leaves the host.
            os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
            os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
            hub_root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="episodestream-hub-")))
            (hub_root / "datasets" / HUB_OWNER).mkdir(parents=True)
            (hub_root / "datasets" / HUB_OWNER / name).symlink_to(Path(root).resolve(), target_is_directory=True)
            hub = stack.enter_context(FakeHub(hub_root, redirect_resolve=hub_redirect))
            proxies = [_link(stack, hub.url, settings)]
            if hub_redirect:
                proxies.append(_link(stack, hub.cdn_url, settings))
                hub.redirect_base_url = proxies[1].url  # the redirects point at the CDN's link
            yield RemoteSource(kind, f"{HUB_OWNER}/{name}", {"hub_endpoint": proxies[0].url, "token": False},
                               proxies)
        else:
            s3 = stack.enter_context(S3Server())
            s3.upload_folder(root, BUCKET, name)
            proxy = _link(stack, s3.url, settings)
            options = s3.storage_options()
            options["client_kwargs"]["endpoint_url"] = proxy.url
            yield RemoteSource(kind, f"s3://{BUCKET}/{name}", {"storage_options": options}, [proxy])
