"""Who asks, for the job queue: a session's lane is its visitor (its address, or a trusted proxy's).

The queue is fair across visitors, not tabs: one client with four tabs has one lane and at most
``quotas.visitor_cap()`` jobs queued or running (``pool.Pool``). The visitor is the address the web
server saw (Streamlit's ``st.context.ip_address``: None on loopback; from a proxy on loopback its
server already takes ``X-Forwarded-For``'s right-most hop that is not loopback). Behind a proxy on
another address every visitor has the proxy's address, so ``X-Forwarded-For`` is read, but only
when the connection comes from a proxy named in ``$REMAT_LAB_TRUSTED_PROXIES`` (addresses or
networks, comma- or space-separated): its right-most hop that is not a trusted proxy is the visitor
(the hops left of it are whatever the client wrote). IPv6 addresses count by their /64 (one
client's addresses). A connection on loopback without a header cannot be told apart from the
others: its lane is its session, as before.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Hashable, Iterable, Mapping
from typing import NamedTuple

TRUSTED_ENV = "REMAT_LAB_TRUSTED_PROXIES"
LOOPBACK = ("127.0.0.1", "::1")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Lane(NamedTuple):
    """A browser session and its visitor (None: not known; the session is its own lane)."""

    session: str
    visitor: str | None = None


def lane_of(session: Hashable) -> Hashable:
    """The queue lane of ``session`` (a ``Lane``, or any other key: its own lane)."""
    if isinstance(session, Lane):
        return ("visitor", session.visitor) if session.visitor is not None else session.session
    return session


def session_of(session: Hashable) -> Hashable:
    """The browser session's id behind ``session`` (a ``Lane`` or a plain key)."""
    return session.session if isinstance(session, Lane) else session


def trusted_proxies(env: Mapping[str, str] | None = None) -> tuple[Network, ...]:
    """The networks of ``$REMAT_LAB_TRUSTED_PROXIES``; entries that are not an address are left out."""
    text = (os.environ if env is None else env).get(TRUSTED_ENV, "")
    out = []
    for part in text.replace(",", " ").split():
        try:
            out.append(ipaddress.ip_network(part.strip(), strict=False))
        except ValueError:
            continue
    return tuple(out)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1:text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.split(":")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _key(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{addr}/64", strict=False))
    return str(addr.ipv4_mapped or addr) if isinstance(addr, ipaddress.IPv6Address) else str(addr)


def visitor(peer: str | None, forwarded: Iterable[str] = (), trusted: tuple[Network, ...] = ()
            ) -> str | None:
    """The visitor's key for a connection from ``peer`` (None: loopback, as Streamlit reports it)
    carrying the ``X-Forwarded-For`` header lines ``forwarded``; None when it cannot be told."""
    addr = _address(peer) if peer is not None else _address(LOOPBACK[0])
    if addr is None:
        return None

    def is_trusted(a) -> bool:
        return any(a in net for net in trusted if a.version == net.version)

    if not is_trusted(addr):
        return None if peer is None else _key(addr)
    hops = [h for line in forwarded for h in line.split(",") if h.strip()]
    for hop in reversed(hops):  # from the proxy nearest to us outwards
        a = _address(hop)
        if a is None:  # not an address: the chain cannot be trusted past here
            return f"unreadable:{hop.strip()[:64]}"
        if not is_trusted(a):
            return _key(a)
    return None if peer is None else _key(addr)  # only proxies: the proxy itself, or unknown
