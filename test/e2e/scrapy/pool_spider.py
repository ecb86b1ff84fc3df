"""The pool e2e's Scrapy crawl: the shipped recipe (docs/examples/scrapy's
middleware and settings, docs/examples/python's list) fetching the test's
origin until told to stop.

    scrapy runspider pool_spider.py -a urls=http://10.77.0.1:80/scrapy/,https://10.77.0.1:443/scrapy/ \
        -a stop=STOPFILE -a summary=SUMMARY.json -s PROXYLIST_PATH=DIR/proxies.json

Requests go to the URLs in turn, a sequence number appended, as long as
the file STOPFILE does not exist; then the crawl ends once the requests in
flight are done, and SUMMARY.json says what came back: responses, failed
requests (any error, timeout or answer that is not 2xx, after the recipe's
own retries through another proxy) and Scrapy's stats.
"""

import json
import os

import scrapy

import proxy_settings
from proxylist import strip_credentials


class PoolSpider(scrapy.Spider):
    name = "pool-e2e"
    custom_settings = {k: v for k, v in vars(proxy_settings).items() if k.isupper()}

    def __init__(self, urls="", stop="", summary="", **kwargs):
        super().__init__(**kwargs)
        self.urls = [u for u in urls.split(",") if u]
        self.stop_file = stop
        self.summary_file = summary
        self.responses = 0
        self.failed = 0
        self.failures = []

    def start_requests(self):
        # Scrapy takes start requests as it has room for them: an endless
        # generator is a crawl that goes on until the stop file appears.
        i = 0
        while not os.path.exists(self.stop_file):
            yield scrapy.Request(f"{self.urls[i % len(self.urls)]}{i}", callback=self.parse,
                                 errback=self.failed_request, dont_filter=True)
            i += 1

    def parse(self, response):
        self.responses += 1

    def failed_request(self, failure):
        self.failed += 1
        if len(self.failures) < 20:
            request = failure.request
            via = strip_credentials(request.meta.get("proxylist_proxy") or "no proxy")
            status = getattr(getattr(failure.value, "response", None), "status", "")
            self.failures.append(f"{request.url} via {via}: {status} {failure.getErrorMessage()}".replace("  ", " "))

    def closed(self, reason):
        stats = self.crawler.stats.get_stats()
        with open(self.summary_file, "w", encoding="utf-8") as f:
            json.dump({"reason": reason, "responses": self.responses, "failed": self.failed,
                       "failures": self.failures, "stats": stats}, f, default=str, indent=1)
