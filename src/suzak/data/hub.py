"""Talking to the Hugging Face Hub without hanging: one quick reachability probe, then offline mode if it fails.

Without network, ``datasets.load_dataset`` and ``from_pretrained`` retry for ~25 s and print a stack of retry lines
before failing. suzak probes the Hub endpoint once (a TCP connect with a short timeout); when it is unreachable, the
load runs in the libraries' offline mode, so a locally cached copy still loads and a missing one fails at once with
one clear line.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
from collections.abc import Iterator
from urllib.parse import urlparse

from suzak import SuzakError

__all__ = ["hub_reachable", "load_hub_dataset", "offline_unless_reachable"]

logger = logging.getLogger(__name__)


@functools.cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub endpoint (``HF_ENDPOINT``, default huggingface.co) accepts a TCP connection."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError as error:
        logger.info("Hub endpoint %s unreachable (%s): using offline mode", constants.ENDPOINT, error)
        return False


@contextlib.contextmanager
def offline_unless_reachable() -> Iterator[bool]:
    """Run the block in huggingface_hub/datasets offline mode when the Hub can't be reached; yields ``offline``."""
    import datasets.config
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE or not hub_reachable()
    saved = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = offline
    try:
        yield offline
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved


def load_hub_dataset(repo_id: str, config_name: str | None = None, *, split: str = "train", hint: str = "", **kwargs):
    """``datasets.load_dataset`` that fails with one clear line (a :class:`SuzakError`) instead of retrying."""
    import datasets

    with offline_unless_reachable() as offline:
        try:
            return datasets.load_dataset(repo_id, config_name, split=split, **kwargs)
        except Exception as error:  # noqa: BLE001 - any loader failure becomes the one-line error below
            why = "the Hub is unreachable and no cached copy exists" if offline else _first_line(error)
            raise SuzakError(
                f"cannot load Hub dataset {repo_id!r}"
                + (f" ({config_name})" if config_name else "")
                + f" split {split!r}: {why}. {hint or 'Point dataset_name at a local copy instead.'}"
            ) from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
