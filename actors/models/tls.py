"""The TLS context the host's HTTP clients (model providers, reference fetches) verify with.

Building one reads the certificate bundle from disk, which takes tens of milliseconds: done on
the loop for each model call, it held every agent and server that long. It is built once per
process, in a worker thread, and shared (an ``ssl.SSLContext`` is safe to share between
connections and clients).
"""

from __future__ import annotations

import ssl

import trio

_context: ssl.SSLContext | None = None


async def tls_context() -> ssl.SSLContext:
    """The shared context, with httpx's defaults (the certifi bundle). Two first callers at once
    may both build one; the last built is kept, and either serves."""
    global _context
    if _context is None:
        import httpx  # only where a provider or a fetch needs it

        _context = await trio.to_thread.run_sync(httpx.create_ssl_context)
    return _context
