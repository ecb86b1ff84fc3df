"""requests.Session that sends every request through the pool's list, never direct.

    from proxied_session import ProxiedSession
    session = ProxiedSession("/etc/proxies/proxies.json")
    response = session.get("https://example.org/")

proxylist.py (docs/examples/python) must be importable. The promises are
those of docs/pools.md ("Using the list from a crawler"), as in the Scrapy
middleware, for a synchronous client:

- no list file: the constructor raises ProxyListError naming the path;
- an empty list blocks the call (asking again every hold_delay seconds,
  an ERROR at most every log_interval seconds) until a proxy is listed;
  after empty_timeout seconds of uninterrupted emptiness it raises
  ProxyListError with reason "proxy_list_empty": stop crawling;
- 407 or a failed connection to the proxy marks it dead (backoff) and the
  request goes again through another, up to retry_times; 403/429 is
  counted as a ban signal and the response returned.
"""

import time
from urllib.parse import urlsplit

import requests

from proxylist import DEFAULT_PATH, ProxyList


class ProxiedSession(requests.Session):
    def __init__(self, path=DEFAULT_PATH, hold_delay=1.0, retry_times=5, **list_options):
        super().__init__()
        # The environment (HTTP_PROXY, NO_PROXY, .netrc) must not choose
        # the route: the list does.
        self.trust_env = False
        self.proxies_list = ProxyList(path, **list_options)
        self.hold_delay = hold_delay
        self.retry_times = retry_times

    def request(self, method, url, *args, **kwargs):
        # Redirects are followed here, each hop a request of its own: the
        # new host may be one the proxy is banned on.
        follow = kwargs.pop("allow_redirects", True)
        for _ in range(self.max_redirects + 1):
            response = self._send_through_proxy(method, url, *args, **kwargs)
            if not (follow and response.is_redirect):
                return response
            url = requests.compat.urljoin(url, response.headers["location"])
            if response.status_code == 303 or (response.status_code in (301, 302) and method == "POST"):
                method = "GET"
                kwargs.pop("data", None)
                kwargs.pop("json", None)
        raise requests.exceptions.TooManyRedirects(f"exceeded {self.max_redirects} redirects", response=response)

    def _send_through_proxy(self, method, url, *args, **kwargs):
        host = urlsplit(url).hostname
        for attempt in range(self.retry_times + 1):
            proxy = self._wait_for_proxy(host)
            kwargs["proxies"] = {"http": proxy.url, "https": proxy.url}
            last = attempt == self.retry_times
            try:
                response = super().request(method, url, *args, allow_redirects=False, **kwargs)
            except (requests.exceptions.ProxyError, requests.exceptions.ConnectTimeout) as e:
                self.proxies_list.mark_dead(proxy, type(e).__name__)
                if last:
                    raise
                continue
            if response.status_code == 407:
                self.proxies_list.mark_dead(proxy, "407 Proxy Authentication Required")
                if not last:
                    continue
                return response
            self.proxies_list.mark_alive(proxy)
            response.proxy_label = proxy.label  # the replica's name, never its credential
            if response.status_code in (403, 429):
                self.proxies_list.record_ban(proxy, host, response.status_code)
            return response

    def _wait_for_proxy(self, host):
        start = self.proxies_list.clock()
        while True:
            proxy = self.proxies_list.acquire(host, self.proxies_list.clock() - start)
            if proxy is not None:
                return proxy
            self.proxies_list.complain_held(host, 1)
            time.sleep(self.hold_delay)
