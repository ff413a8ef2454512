"""The sidestep transports for httpx2, the fork of httpx the OpenAI and Anthropic SDKs run on.

The same shells as `sidestep.AsyncFailoverTransport` and
`sidestep.FailoverTransport`, bound to httpx2's classes: every decision is
shared. httpx2 is optional (the ``httpx2`` extra, or an SDK that brings it):
without it, importing this module raises an `ImportError` that says so.
"""

from __future__ import annotations

from ._shells.httpx2 import AsyncFailoverTransport, FailoverTransport

__all__ = ["AsyncFailoverTransport", "FailoverTransport"]
