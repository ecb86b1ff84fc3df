"""Scrapy downloader middleware: every request through the pool's list, never direct.

Enable it with the settings in proxy_settings.py; proxylist.py
(docs/examples/python) must be importable. What it promises is in
docs/pools.md ("Using the list from a crawler"); in short:

- no list file at start: the crawl does not start, the error names the path
  and the process exits 1 (not NotConfigured: Scrapy would drop the
  middleware without a word and crawl from the crawler's own address);
- an empty list holds requests (each waits in the downloader and asks again
  every PROXYLIST_HOLD_DELAY seconds), logging an ERROR at most every
  PROXYLIST_LOG_INTERVAL seconds; after PROXYLIST_EMPTY_TIMEOUT seconds of
  uninterrupted emptiness the spider closes with reason proxy_list_empty
  and the process exits 1;
- 407 or a refused connection marks the proxy dead (backoff) and retries
  the request through another; 403/429 is counted as a ban signal and, with
  PROXYLIST_BAN_POOL set, reported to the operator as a ProxyBan once a
  proxy has had PROXYLIST_BAN_THRESHOLD of them from a domain.
"""

import atexit
import logging
import os
import sys

from scrapy import signals
from scrapy.core.downloader.handlers.http11 import TunnelError
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import reactor, task
from twisted.internet.error import ConnectError, DNSLookupError

from proxylist import DEFAULT_PATH, EMPTY_REASON, SERVICE_ACCOUNT_DIR, BanReporter, ProxyList, ProxyListError

logger = logging.getLogger(__name__)

# Failures of the connection to the proxy itself (through a proxy, the
# site's own refusals come back as responses).
PROXY_FAILURES = (ConnectError, DNSLookupError, TunnelError)
META_KEY = "proxylist_proxy"  # meta["proxy"] loses its credential in HttpProxyMiddleware


class ProxyListMiddleware:
    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        try:
            on_ban = None
            if s.get("PROXYLIST_BAN_POOL"):
                on_ban = BanReporter(
                    s.get("PROXYLIST_BAN_POOL"),
                    namespace=s.get("PROXYLIST_BAN_NAMESPACE") or None,
                    threshold=s.getint("PROXYLIST_BAN_THRESHOLD", 3),
                    replace=s.getbool("PROXYLIST_BAN_REPLACE", False),
                    api_url=s.get("PROXYLIST_BAN_API") or None,
                    account_dir=s.get("PROXYLIST_BAN_ACCOUNT_DIR") or SERVICE_ACCOUNT_DIR,
                )
            proxies = ProxyList(
                s.get("PROXYLIST_PATH", DEFAULT_PATH),
                reload_interval=s.getfloat("PROXYLIST_RELOAD_INTERVAL", 5),
                empty_timeout=s.getfloat("PROXYLIST_EMPTY_TIMEOUT", 300),
                log_interval=s.getfloat("PROXYLIST_LOG_INTERVAL", 30),
                backoff_base=s.getfloat("PROXYLIST_BACKOFF_BASE", 30),
                backoff_cap=s.getfloat("PROXYLIST_BACKOFF_CAP", 600),
                on_ban=on_ban,
            )
        except (ProxyListError, ValueError, OSError) as e:
            logger.critical("%s", e)
            exit_nonzero_at_end()
            raise  # stops the crawl: Scrapy creates no engine without its middlewares
        mw = cls(crawler, proxies, s.getfloat("PROXYLIST_HOLD_DELAY", 1), s.getint("PROXYLIST_RETRY_TIMES", 5))
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    def __init__(self, crawler, proxies, hold_delay, retry_times):
        self.crawler = crawler
        self.proxies = proxies
        self.hold_delay = hold_delay
        self.retry_times = retry_times
        self.held = 0
        self.closing = False

    async def process_request(self, request, spider):
        host = urlparse_cached(request).hostname
        start = self.proxies.clock()
        self.held += 1
        try:
            while True:
                if self.closing:
                    raise IgnoreRequest(f"crawl closing: {EMPTY_REASON}")
                try:
                    proxy = self.proxies.acquire(host, self.proxies.clock() - start)
                except ProxyListError as e:
                    if e.reason == EMPTY_REASON:
                        self._close(spider, e)
                    else:
                        logger.error("%s: %s", request, e)
                    raise IgnoreRequest(str(e))
                if proxy is not None:
                    break
                self.crawler.stats.inc_value("proxylist/held_waits")
                self.proxies.complain_held(host, self.held)
                await maybe_deferred_to_future(task.deferLater(reactor, self.hold_delay, lambda: None))
        finally:
            self.held -= 1
        request.meta["proxy"] = proxy.url
        request.meta[META_KEY] = proxy.url
        return None

    def process_response(self, request, response, spider):
        proxy = self.proxies.find(request.meta.get(META_KEY))
        if proxy is None:
            return response
        if response.status == 407:
            self.proxies.mark_dead(proxy, "407 Proxy Authentication Required")
            return self._retry(request) or response
        self.proxies.mark_alive(proxy)
        if response.status in (403, 429):
            self.crawler.stats.inc_value(f"proxylist/ban_signal/{response.status}")
            self.proxies.record_ban(proxy, urlparse_cached(request).hostname, response.status)
        return response

    def process_exception(self, request, exception, spider):
        proxy = self.proxies.find(request.meta.get(META_KEY))
        if proxy is None or not isinstance(exception, PROXY_FAILURES):
            return None
        self.proxies.mark_dead(proxy, f"{type(exception).__name__}: {exception}")
        return self._retry(request)

    def _retry(self, request):
        """The request again, through another proxy; None when it has been
        retried PROXYLIST_RETRY_TIMES times (Scrapy's own handling follows)."""
        tries = request.meta.get("proxylist_retries", 0)
        if tries >= self.retry_times:
            return None
        self.crawler.stats.inc_value("proxylist/retries")
        retry = request.copy()
        retry.meta["proxylist_retries"] = tries + 1
        retry.dont_filter = True
        return retry

    def _close(self, spider, error):
        if self.closing:
            return
        self.closing = True
        logger.error("%s", error)
        self.crawler.stats.set_value("proxylist/gave_up", EMPTY_REASON)
        exit_nonzero_at_end()
        self.crawler.engine.close_spider(spider, EMPTY_REASON)

    def spider_closed(self, spider, reason):
        if reason == EMPTY_REASON:
            exit_nonzero_at_end()


_exit_registered = False


def exit_nonzero_at_end():
    """Makes the process exit 1 once Scrapy is done: Scrapy 2.8 exits 0
    whatever stopped the crawl, and a crawl that had no proxy must fail
    (its Kubernetes Job too)."""
    global _exit_registered
    if _exit_registered:
        return
    _exit_registered = True

    def _exit():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    atexit.register(_exit)
