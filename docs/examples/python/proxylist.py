"""The list a ProxyPool publishes, read so that no request ever goes direct.

The pool's Secret, mounted as a directory, holds proxies.txt (one proxy URL a
line) and proxies.json (an array of {name, url, host, egressAddress,
createdAt, expiresAt, bannedDomains}). ProxyList reads either file and keeps
the promises of docs/pools.md ("Using the list from a crawler"):

- a missing or unreadable list at start is an error naming the path;
- an empty list is not a reason to go direct: callers hold their requests
  (acquire returns None: wait and ask again) and give up only after the
  list has been empty for empty_timeout seconds in a row
  ("proxy_list_empty");
- the file is re-read every reload_interval seconds, following the symlink
  the kubelet swaps (..data), so a drained proxy stops being used;
- a proxy that refuses connections or answers 407 is dead for a while
  (exponential backoff); a 403 or 429 from a site is a ban signal counted
  per proxy and domain and handed to report_ban;
- a proxy is not used for a host under one of its bannedDomains until the
  ban expires.

Only the standard library: the Scrapy middleware and the requests session
beside it in docs/examples/ are thin adapters over this class.
"""

import json
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

DEFAULT_PATH = "/etc/proxies/proxies.json"
EMPTY_REASON = "proxy_list_empty"

logger = logging.getLogger("proxylist")


class ProxyListError(RuntimeError):
    """The list cannot be used: missing or unreadable at start, or empty
    for longer than the bound (reason EMPTY_REASON)."""

    def __init__(self, message, reason="proxy_list_unreadable"):
        super().__init__(message)
        self.reason = reason


@dataclass
class Proxy:
    url: str
    name: str = ""
    # domain -> expiry (UTC datetime), from bannedDomains.
    bans: dict = field(default_factory=dict)
    # Dead-proxy backoff: consecutive failures and until when (monotonic).
    failures: int = 0
    dead_until: float = 0.0

    @property
    def label(self):
        """How logs name the proxy: its replica, never its credential."""
        return self.name or strip_credentials(self.url)

    def banned_for(self, host, now_utc):
        host = (host or "").lower().rstrip(".")
        for domain, expires in self.bans.items():
            if (host == domain or host.endswith("." + domain)) and expires > now_utc:
                return True
        return False


def strip_credentials(url):
    scheme, sep, rest = url.partition("://")
    return scheme + sep + rest.rpartition("@")[2]


def report_ban(proxy, domain, status, count):
    """Hook: called for every 403/429 a site answered through proxy.

    Reporting bans to the operator (annotating the Proxy, see docs/pools.md
    "Reporting a banned proxy") comes later; replace this function, e.g.
    proxylist.report_ban = my_reporter, to do it now."""


def parse(path, text):
    """Returns the proxies in text, read from path (.json or lines)."""
    if path.endswith(".json"):
        entries = json.loads(text) if text.strip() else []
        if not isinstance(entries, list):
            raise ValueError("want a JSON array of proxies")
        proxies = []
        for i, e in enumerate(entries):
            if not isinstance(e, dict) or not isinstance(e.get("url"), str) or not e["url"]:
                raise ValueError(f"entry {i}: want an object with a url")
            proxies.append(Proxy(url=e["url"], name=e.get("name") or "", bans=parse_bans(e.get("bannedDomains"))))
        return proxies
    return [Proxy(url=line.strip()) for line in text.splitlines() if line.strip() and not line.startswith("#")]


def parse_bans(entries):
    bans = {}
    for b in entries or []:
        domain = str(b.get("domain", "")).lower().strip(".")
        if not domain:
            continue
        try:
            expires = datetime.fromisoformat(str(b["expiresAt"]).replace("Z", "+00:00"))
            if expires.tzinfo is None:
                expires = expires.replace(tzinfo=timezone.utc)
        except (KeyError, ValueError):
            # A ban we cannot date is honoured: failing closed.
            expires = datetime.max.replace(tzinfo=timezone.utc)
        bans[domain] = max(expires, bans.get(domain, expires))
    return bans


class ProxyList:
    """The current list and what this crawler learned about its proxies."""

    def __init__(self, path=DEFAULT_PATH, reload_interval=5.0, empty_timeout=300.0,
                 log_interval=30.0, backoff_base=30.0, backoff_cap=600.0,
                 clock=time.monotonic):
        self.path = path
        self.reload_interval = reload_interval
        self.empty_timeout = empty_timeout
        self.log_interval = log_interval
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.clock = clock
        self.proxies = []
        self.ban_counts = {}  # (proxy label, domain) -> 403/429 answers
        self._next = 0  # round robin
        self._seen = None  # (target path, inode, mtime, size) last read
        self._checked = 0.0
        self._empty_since = None
        self._last_complaint = None
        try:
            self._load()
        except (OSError, ValueError) as e:
            raise ProxyListError(
                f"proxy list {path}: {e}; refusing to start: without it every request would go out "
                "directly (mount the pool's Secret <pool>-proxies as a directory, see docs/pools.md)") from e

    def _load(self):
        target = os.path.realpath(self.path)
        st = os.stat(target)
        seen = (target, st.st_ino, st.st_mtime_ns, st.st_size)
        self._checked = self.clock()
        if seen == self._seen:
            return
        with open(target, encoding="utf-8") as f:
            fresh = parse(self.path, f.read())
        self._seen = seen
        known = {p.url: p for p in self.proxies}
        # What was learned about a proxy that stays (dead backoff) is kept.
        for p in fresh:
            if p.url in known:
                p.failures, p.dead_until = known[p.url].failures, known[p.url].dead_until
        if [p.url for p in fresh] != [p.url for p in self.proxies]:
            logger.info("proxy list %s: %d proxies (%s)", self.path, len(fresh),
                        ", ".join(p.label for p in fresh) or "none")
        self.proxies = fresh
        self._note_emptiness()

    def _note_emptiness(self):
        if self.proxies:
            if self._empty_since is not None:
                logger.info("proxy list %s has proxies again after %.0f s empty", self.path,
                            self.clock() - self._empty_since)
            self._empty_since = None
        elif self._empty_since is None:
            self._empty_since = self.clock()

    def reload_if_due(self):
        if self.clock() - self._checked < self.reload_interval:
            return
        try:
            self._load()
        except (OSError, ValueError) as e:
            # Gone or garbled after start: as good as empty, never direct.
            if self.proxies or self._seen is not None:
                logger.error("proxy list %s: %s; treating it as empty", self.path, e)
            self.proxies, self._seen = [], None
            self._note_emptiness()

    def choose(self, host):
        """The next proxy for a request to host, or None: then hold it."""
        self.reload_if_due()
        now_utc = datetime.now(timezone.utc)
        allowed = [p for p in self.proxies if not p.banned_for(host, now_utc)]
        if not allowed:
            return None
        now = self.clock()
        alive = [p for p in allowed if p.dead_until <= now]
        if not alive:
            # All dead: try the one whose backoff ends first rather than none.
            return min(allowed, key=lambda p: p.dead_until)
        self._next += 1
        return alive[self._next % len(alive)]

    def acquire(self, host, waited):
        """A proxy for host, or None: hold the request and ask again.

        waited is how long this request has been held. Raises ProxyListError
        once the list has been empty for empty_timeout seconds in a row
        (reason EMPTY_REASON: stop crawling), or when this request has
        waited that long for a proxy not banned for host (reason
        "proxy_banned": give up on this request only)."""
        proxy = self.choose(host)
        if proxy is not None:
            return proxy
        self.check_not_exhausted()
        if self.proxies and waited >= self.empty_timeout:
            raise ProxyListError(
                f"every proxy in {self.path} is banned for {host} and has been for {waited:.0f} s; "
                "dropping the request rather than sending it directly", reason="proxy_banned")
        return None

    def empty_for(self):
        """Seconds the list has been empty without a break, or None."""
        if self._empty_since is None:
            return None
        return self.clock() - self._empty_since

    def check_not_exhausted(self):
        """Raises ProxyListError(reason EMPTY_REASON) once the list has been
        empty for empty_timeout seconds in a row."""
        empty = self.empty_for()
        if empty is not None and empty >= self.empty_timeout:
            raise ProxyListError(
                f"{EMPTY_REASON}: proxy list {self.path} has been empty for {empty:.0f} s "
                f"(bound {self.empty_timeout:.0f} s); giving up rather than sending requests directly",
                reason=EMPTY_REASON)

    def complain_held(self, host, held):
        """Logs, at most every log_interval seconds, that requests wait."""
        now = self.clock()
        if self._last_complaint is not None and now - self._last_complaint < self.log_interval:
            return
        self._last_complaint = now
        empty = self.empty_for()
        if empty is not None:
            logger.error("proxy list %s is empty (for %.0f s): holding %d request(s); giving up after %.0f s",
                         self.path, empty, held, self.empty_timeout)
        else:
            logger.error("proxy list %s: every proxy is banned for %s: holding %d request(s)",
                         self.path, host, held)

    def mark_dead(self, proxy, why):
        proxy.failures += 1
        backoff = min(self.backoff_cap, self.backoff_base * 2 ** (proxy.failures - 1))
        proxy.dead_until = self.clock() + backoff
        logger.warning("proxy %s is dead for %.0f s: %s", proxy.label, backoff, why)

    def mark_alive(self, proxy):
        proxy.failures, proxy.dead_until = 0, 0.0

    def record_ban(self, proxy, host, status):
        key = (proxy.label, (host or "").lower())
        self.ban_counts[key] = self.ban_counts.get(key, 0) + 1
        logger.warning("proxy %s got %d from %s (%d so far)", proxy.label, status, host, self.ban_counts[key])
        report_ban(proxy, host, status, self.ban_counts[key])

    def find(self, url):
        """The listed proxy with this URL, or None (it was dropped)."""
        return next((p for p in self.proxies if p.url == url), None)
