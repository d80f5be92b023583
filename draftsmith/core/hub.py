"""Whether the Hugging Face hub can be reached, asked once per process with a short timeout.

A model name that is no local folder is a hub id, and transformers asks the hub for it, retrying
an unreachable hub for a minute with a warning a try. `offline_unless_hub_reachable` asks once
(through the hub client's own session, so proxies count) and, where the hub cannot be reached,
switches hub access offline for this process: transformers then reads its local cache alone and
fails at once on a model it does not hold.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

from huggingface_hub import constants

logger = logging.getLogger(__name__)

HUB_TIMEOUT_S = 3.0
"""Seconds the one reachability probe waits for the hub's answer."""


@functools.cache
def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether the hub (``HF_ENDPOINT``, default huggingface.co) answers a HEAD request within
    `timeout` seconds (any answer counts: the server is there)."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception as error:  # the client's own connection, timeout and proxy errors
        logger.debug("hub %s not reachable: %s", constants.ENDPOINT, error)
        return False
    return True


def hub_offline() -> bool:
    """Whether hub access is offline (``HF_HUB_OFFLINE``, set by the user or by
    `offline_unless_hub_reachable`)."""
    return bool(constants.HF_HUB_OFFLINE)


def offline_unless_hub_reachable(name_or_path: str) -> bool:
    """For a name that is no local path (a hub id), switch hub access offline for this process
    when the hub cannot be reached, so loading it reads the local hub cache without retries.
    Returns whether hub access is offline for it (False for a local path)."""
    if Path(name_or_path).expanduser().exists():
        return False
    if hub_offline():
        return True
    if hub_reachable():
        return False
    logger.info(
        "the hub %s cannot be reached: looking for %s in the local hub cache only",
        constants.ENDPOINT,
        name_or_path,
    )
    os.environ["HF_HUB_OFFLINE"] = "1"  # for the processes this one starts
    constants.HF_HUB_OFFLINE = True  # what the hub client reads in this one
    return True
