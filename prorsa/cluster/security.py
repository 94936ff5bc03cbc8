"""Dask TLS from a cluster file's `tls:` section.

    make_security(tls) -> Security | None     one certificate for every role (scheduler, workers,
                                               the driver's client), all signed by one CA
    exposure(host, security) -> str | None     the warning a scheduler listening beyond this
                                               machine without TLS gets (None: loopback or TLS)
    dashboard_exposure(address) -> str | None  the warning a dashboard on a wide host gets
    is_loopback(host) -> bool                  only this machine reaches it (a host name: False)

distributed requires a certificate from both ends of every connection (mutual TLS), so a client
that cannot present one signed by the CA is refused at the handshake.
"""

from __future__ import annotations

import ipaddress

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



def exposure(host: str | None, security: Security | None) -> str | None:
    """Dask's protocol runs whatever a peer sends it: reachable from the network without mutual
    TLS, a scheduler lets anyone who reaches it run code as this user. `host` None: every
    interface (what a batch cluster file's scheduler needs by default)."""
    if security is not None or (host is not None and is_loopback(host)):
        return None
    return (f"warning: the Dask scheduler listens on {host or 'every interface'} without TLS: anyone "
            "who can reach it can run code as this user; a tls: section in the cluster file turns "
            "on mutual TLS (cluster/slurm-tls.yaml)")


def dashboard_exposure(address: str | None) -> str | None:
    """The dashboard has no login: on a host beyond this machine anyone who reaches it reads the run."""
    host = None if address is None else address.rpartition(":")[0]
    if address is None or is_loopback(host or ""):
        return None
    return (f"warning: the dashboard listens on {host or 'every interface'} ({address}) without a login: "
            "anyone who can reach it sees the run; runtime.dashboard_address: 127.0.0.1:0 keeps it on this machine")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False
