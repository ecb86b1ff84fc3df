"""A spider that fetches the URLs it is given, each through a listed proxy.

    PYTHONPATH=../python:. scrapy runspider example_spider.py -a urls=https://example.org/,https://example.com/

The proxy settings come from proxy_settings.py, as they would from a
project's settings.py; -s PROXYLIST_PATH=... overrides them.
"""

import scrapy

import proxy_settings
from proxylist import strip_credentials


class ExampleSpider(scrapy.Spider):
    name = "example"
    custom_settings = {k: v for k, v in vars(proxy_settings).items() if k.isupper()}

    def __init__(self, urls="", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [u for u in urls.split(",") if u]

    def parse(self, response):
        yield {
            "url": response.url,
            "status": response.status,
            "proxy": strip_credentials(response.meta["proxylist_proxy"]),
        }
