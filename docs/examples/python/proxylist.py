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
  per proxy and domain and handed to on_ban, e.g. a BanReporter, which
  reports the ban to the operator as a ProxyBan (docs/pools.md "Reporting
  a banned proxy");
- a proxy is not used for a host under one of its bannedDomains until the
  ban expires.

Only the standard library: the Scrapy middleware and the requests session
beside it in docs/examples/ are thin adapters over this class.
"""

import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone

DEFAULT_PATH = "/etc/proxies/proxies.json"
EMPTY_REASON = "proxy_list_empty"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

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


class BanReporter:
    """Reports bans to the operator: once a proxy has had threshold 403/429
    answers from a domain, a ProxyBan naming the pool, the proxy (its name
    in proxies.json), the domain and "HTTP <status> x<count>" is created in
    the pool's namespace through the Kubernetes API, with the pod's service
    account (bound to the ClusterRole crawl-ban-reporter-role, which may
    create ProxyBans and nothing else). Once per proxy and domain; the pool
    then lists the domain in the proxy's bannedDomains, and replaces the
    proxy when asked (replace) or when it is banned on enough domains.

    Called as on_ban(proxy, domain, status, count) by ProxyList. It never
    blocks the crawl (the request is sent from a thread) and never fails
    it: a report the API refuses is logged with the API's message, which
    names the field. The token is read at each report (the kubelet rotates
    it) and never logged.

    api_url and account_dir default to what a pod has: the API server from
    KUBERNETES_SERVICE_HOST/PORT, and the token, ca.crt and namespace of
    the mounted service account; namespace defaults to the pod's own."""

    def __init__(self, pool, namespace=None, threshold=3, replace=False, api_url=None,
                 account_dir=SERVICE_ACCOUNT_DIR, timeout=10.0):
        if not pool:
            raise ValueError("BanReporter: pool (the ProxyPool's name) is required")
        self.pool = pool
        self.account_dir = account_dir
        self.namespace = namespace or self._read("namespace").strip()
        self.threshold = max(1, int(threshold))
        self.replace = bool(replace)
        if not api_url:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ValueError("BanReporter: no api_url and KUBERNETES_SERVICE_HOST is not set (not in a pod)")
            api_url = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        self.api_url = api_url.rstrip("/")
        self.timeout = timeout
        self.reported = set()
        self._lock = threading.Lock()

    def _read(self, name):
        with open(os.path.join(self.account_dir, name), encoding="utf-8") as f:
            return f.read()

    def __call__(self, proxy, domain, status, count):
        domain = (domain or "").lower().rstrip(".")
        if count < self.threshold or not domain:
            return
        if not proxy.name:
            logger.error("cannot report proxy %s banned on %s: the list has no names (read proxies.json, not proxies.txt)",
                         proxy.label, domain)
            return
        with self._lock:
            if (proxy.name, domain) in self.reported:
                return
            self.reported.add((proxy.name, domain))
        threading.Thread(target=self.report, args=(proxy.name, domain, f"HTTP {status} x{count}"),
                         name="ban-report").start()

    def report(self, proxy, domain, reason):
        """Creates the ProxyBan; returns its name, or None when it failed."""
        body = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyBan",
                "metadata": {"generateName": f"{self.pool}-ban-"},
                "spec": {"pool": self.pool, "proxy": proxy, "domain": domain, "reason": reason, "replace": self.replace}}
        url = f"{self.api_url}/apis/crawl.example.com/v1alpha1/namespaces/{self.namespace}/proxybans"
        try:
            token = self._read("token").strip()
            context = ssl.create_default_context(cafile=os.path.join(self.account_dir, "ca.crt"))
            request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": "application/json"})
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as response:
                name = json.load(response)["metadata"]["name"]
        except urllib.error.HTTPError as e:
            try:
                message = json.load(e).get("message", "")
            except ValueError:
                message = ""
            logger.error("reporting proxy %s banned on %s: the API refused it (%d): %s", proxy, domain, e.code,
                         message or e.reason)
            return None
        except (OSError, ValueError, KeyError) as e:
            logger.error("reporting proxy %s banned on %s: %s", proxy, domain, e)
            return None
        logger.warning("reported proxy %s banned on %s (%s) to pool %s/%s: ProxyBan %s", proxy, domain, reason,
                       self.namespace, self.pool, name)
        return name


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
                 clock=time.monotonic, on_ban=None):
        self.path = path
        self.reload_interval = reload_interval
        self.empty_timeout = empty_timeout
        self.log_interval = log_interval
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.clock = clock
        # on_ban(proxy, domain, status, count) for every ban signal, e.g. a
        # BanReporter; None: counted and logged only.
        self.on_ban = on_ban
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
        if self.on_ban is not None:
            self.on_ban(proxy, host, status, self.ban_counts[key])

    def find(self, url):
        """The listed proxy with this URL, or None (it was dropped)."""
        return next((p for p in self.proxies if p.url == url), None)
