"""Which network addresses and URL host spellings a media fetch may use (the SSRF rules, pure functions)."""

from __future__ import annotations

import ipaddress
import re

from servers.openai.bodies.errors import ApiError

# IPv6 ranges Python's `is_global` lets through but that reach private space or embed an IPv4 address.
# The embedding ones are refused outright rather than judged by the IPv4 address inside them: no public
# media host needs them, and refusing leaves no translation gateway or relay to reason about.
REFUSED_V6 = tuple(ipaddress.IPv6Network(n) for n in (
    "64:ff9b::/96",  # NAT64 well-known prefix (embeds IPv4)
    "64:ff9b:1::/48",  # NAT64 local-use prefix (embeds IPv4)
    "2002::/16",  # 6to4 (embeds IPv4)
    "2001::/32",  # Teredo (embeds an obfuscated IPv4)
    "::/96",  # IPv4-compatible ::a.b.c.d (deprecated; embeds IPv4), also :: and ::1
    "::ffff:0:0:0/96",  # IPv4-translated ::ffff:0:a.b.c.d (SIIT; embeds IPv4)
    "fec0::/10",  # site-local (deprecated, private by intent)
))

_NUMBER_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)


def is_public_address(address: str) -> bool:
    """True for a globally routable unicast address.

    IPv4-mapped IPv6 (::ffff:a.b.c.d) is judged by its IPv4 address; every other IPv6 form that embeds
    an IPv4 address (NAT64, 6to4, Teredo, IPv4-compatible, IPv4-translated) is refused, as is site-local.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif any(ip in net for net in REFUSED_V6):
            return False
    return ip.is_global and not ip.is_multicast


def check_host_form(host: str) -> None:
    """Refuse (400) a host that a URL parser would read as an IPv4 number unless it is a plain dotted quad.

    Octal (0177.0.0.1), hex (0x7f.1), shortened (127.1) and single-integer (2130706433) forms are read
    differently by different resolvers and clients, so none of them is accepted, whatever the policy.
    """
    last = host.rstrip(".").rsplit(".", 1)[-1]
    if ":" in host or not _NUMBER_LABEL.fullmatch(last):
        return  # an IPv6 literal or a DNS name: checked by its resolved address
    try:
        canonical = str(ipaddress.IPv4Address(host))
    except ValueError:
        canonical = ""
    if canonical != host:
        raise ApiError(400, f"media URL host {host!r} is not a plain dotted-quad IPv4 address "
                       "(octal, hex, shortened and integer forms are refused)", param="url")
