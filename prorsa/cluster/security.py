"""Dask TLS from a cluster file's `tls:` section.

    make_security(tls) -> Security | None     one certificate for every role (scheduler, workers,
                                               the driver's client), all signed by one CA

distributed requires a certificate from both ends of every connection (mutual TLS), so a client
that cannot present one signed by the CA is refused at the handshake.
"""

from __future__ import annotations

from distributed.security import Security

from prorsa.config.cluster import TlsSettings


def make_security(tls: TlsSettings | None) -> Security | None:
    if tls is None:
        return None
    pair: dict[str, str | None] = {}
    for role in ("client", "scheduler", "worker"):
        pair[f"tls_{role}_cert"] = tls.cert
        pair[f"tls_{role}_key"] = tls.key
    return Security(tls_ca_file=tls.ca_file, require_encryption=tls.require_encryption, **pair)

