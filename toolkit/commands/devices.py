"""Which devices this build can run on; asking for another is a user error, not a crash."""
from __future__ import annotations

from ..errors import UserError


def check_device(device: str) -> None:
    if device == "cpu":
        return
    raise UserError(f"device '{device}' is not available in this build yet (available: cpu)")
