"""Per-group options: what `pg_options` of init_process_group / new_group may carry."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from fairring._sizes import parse_size

# ProcessGroupNCCL exists only in torch builds with NCCL.
_NCCL_OPTIONS: type | None = getattr(getattr(dist, "ProcessGroupNCCL", None), "Options", None)


@dataclass(frozen=True)
class Options:
    """A fairring group's options, passed as `pg_options`.

    engine: None follows the environment (CPU all-reduces on the engine,
        CUDA ones where FAIRRING_CUDA_ENGINE is on); True puts this group's
        CUDA all-reduces on the engine too; False keeps the group off the
        engine entirely, every all-reduce going to Gloo or NCCL.
    flat_threshold: bytes, or a size as FAIRRING_FLAT_THRESHOLD takes it
        ("4MiB"); all-reduces smaller than this take the delegate's own
        all-reduce (FAIRRING_FLAT_THRESHOLD for this group only); "auto":
        measured at the group's first all-reduce the engine could take.
    nccl: a ProcessGroupNCCL.Options for every NCCL group fairring makes for
        this group (its delegate and the engine's local groups): high-priority
        streams and NCCL's config are kept; the timeout is always the group's.
    """

    engine: bool | None = None
    flat_threshold: int | str | None = None
    nccl: Any = None

    def __post_init__(self) -> None:
        # Only bools: 0 == False, but the code that reads it asks `is False`, so engine=0 would
        # have left the engine on.
        if self.engine is not None and not isinstance(self.engine, bool):
            raise TypeError(f"fairring.Options.engine must be None, True or False, not {self.engine!r}")
        threshold = self.flat_threshold
        if isinstance(threshold, str) and threshold != "auto":
            threshold = parse_size("fairring.Options.flat_threshold", threshold, allow_zero=True)
            object.__setattr__(self, "flat_threshold", threshold)  # frozen: set once, here
        byte_count = isinstance(threshold, int) and not isinstance(threshold, bool) and threshold >= 0
        if threshold not in (None, "auto") and not byte_count:
            raise TypeError(
                "fairring.Options.flat_threshold must be a byte count >= 0, a size such as '4MiB', 'auto' "
                f"or None, not {threshold!r}"
            )
        if self.nccl is not None and (_NCCL_OPTIONS is None or not isinstance(self.nccl, _NCCL_OPTIONS)):
            raise TypeError(
                f"fairring.Options.nccl must be a torch.distributed.ProcessGroupNCCL.Options, not {type(self.nccl)!r}"
            )


def group_options(pg_options: object) -> Options:
    """`pg_options` as torch hands it to the backend's creator, checked.

    A plain ProcessGroupNCCL.Options is what an NCCL job passes: it is kept
    for fairring's NCCL groups rather than refused or dropped.
    """
    if pg_options is None:
        return Options()
    if isinstance(pg_options, Options):
        return pg_options
    if _NCCL_OPTIONS is not None and isinstance(pg_options, _NCCL_OPTIONS):
        return Options(nccl=pg_options)
    raise TypeError(
        f"fairring: pg_options of type {type(pg_options).__name__} cannot be used; pass fairring.Options("
        "engine=..., flat_threshold=..., nccl=...), a torch.distributed.ProcessGroupNCCL.Options, or None"
    )


def nccl_options(template: Any, timeout: timedelta) -> Any:
    """A fresh ProcessGroupNCCL.Options for one of fairring's NCCL groups.

    Fresh, since ProcessGroupNCCL keeps its options object and torch writes
    group-specific fields (name, ranks, split source) into the one it is given;
    the user's priority and NCCL config are copied from `template` by value.
    """
    assert _NCCL_OPTIONS is not None, "NCCL groups are made only where torch has NCCL"
    options = _NCCL_OPTIONS()
    if template is not None:
        options.is_high_priority_stream = template.is_high_priority_stream
        options.config = template.config
    options._timeout = timeout
    return options
