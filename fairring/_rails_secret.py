"""FAIRRING_RAILS_SECRET, the operator's secret that the rails' keys derive from, and FAIRRING_RAILS_ENCRYPT.

Without it each group's rails key is random bytes met in the group's store (csrc/rails/auth/rails_key.h),
so whoever can read the store can join the rails; with it, reading the store gives nothing away. It is
never logged, published or compared between ranks: only whether it is set is (a rank with another
value fails its first handshake, saying so).
"""

from __future__ import annotations

from ._errors import ConfigError

RAILS_SECRET = "FAIRRING_RAILS_SECRET"
MIN_RAILS_SECRET_BYTES = 16
# The TensorPipe rails seal every message with AES-256-GCM (csrc/rails/tensorpipe/pipe_cipher.h).
RAILS_ENCRYPT = "FAIRRING_RAILS_ENCRYPT"


def parse_rails_secret(raw: str | None) -> str | None:
    """The secret, or None where unset or empty; too short a one is refused without quoting it."""
    if raw is None or raw == "":
        return None
    if len(raw.encode()) < MIN_RAILS_SECRET_BYTES:
        raise ConfigError(
            f"{RAILS_SECRET} is {len(raw.encode())} bytes long; use at least {MIN_RAILS_SECRET_BYTES} random "
            "ones, the same on every rank of the job (e.g. the output of `openssl rand -hex 32`)"
        )
    return raw


def check_rails_encrypt(encrypt: bool, rails_transport: str, cuda_rails_buffers: bool) -> None:
    """Refuses FAIRRING_RAILS_ENCRYPT=1 where the rails would carry what it cannot seal."""
    if not encrypt:
        return
    if rails_transport != "tensorpipe":
        raise ConfigError(
            f"{RAILS_ENCRYPT}=1 needs the TensorPipe rails: NIXL's one-sided writes land in the reader's "
            "memory unopened; unset one of the two (docs/security.md)"
        )
    if cuda_rails_buffers:
        raise ConfigError(
            f"{RAILS_ENCRYPT}=1 seals host memory, and FAIRRING_CUDA_WAIT=host puts CUDA buffers on the rails: "
            "use FAIRRING_CUDA_WAIT=stream (the default), whose rails carry a pinned host copy"
        )
