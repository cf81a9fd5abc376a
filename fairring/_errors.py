"""The errors fairring raises: for a bad configuration, and failures in torch.distributed's classes."""

from __future__ import annotations

import torch.distributed as dist


class ConfigError(ValueError):
    """An environment variable holds a value fairring cannot use."""


def dist_error_like(cause: BaseException, message: str) -> dist.DistError:
    """`message` as an error of `cause`'s torch.distributed class, DistBackendError where it has none.

    A wrapper that adds what was under way keeps the class torchelastic, torchft
    and users' retry loops catch, as NCCL's and Gloo's errors have it.
    """
    for kind in (dist.DistNetworkError, dist.DistStoreError, dist.DistBackendError):
        if isinstance(cause, kind):
            return kind(message)
    return dist.DistBackendError(message)
