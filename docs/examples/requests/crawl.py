"""Fetches the URLs it is given, one after another, each through a listed
proxy, and prints one JSON line per response.

    PYTHONPATH=../python:. python3 crawl.py --list /etc/proxies/proxies.json https://example.org/

Exits 1 when the list is missing at start, or has been empty for
--empty-timeout seconds in a row (proxy_list_empty).
"""

import argparse
import json
import logging
import sys

from proxied_session import ProxiedSession
from proxylist import EMPTY_REASON, ProxyListError


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", default="/etc/proxies/proxies.json", help="proxies.json or proxies.txt")
    ap.add_argument("--reload-interval", type=float, default=5)
    ap.add_argument("--empty-timeout", type=float, default=300)
    ap.add_argument("--hold-delay", type=float, default=1)
    ap.add_argument("--log-interval", type=float, default=30)
    ap.add_argument("--backoff-base", type=float, default=30)
    ap.add_argument("urls", nargs="*")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        session = ProxiedSession(args.list, hold_delay=args.hold_delay, reload_interval=args.reload_interval,
                                 empty_timeout=args.empty_timeout, log_interval=args.log_interval,
                                 backoff_base=args.backoff_base)
        for url in args.urls:
            try:
                response = session.get(url, timeout=30)
            except ProxyListError as e:
                if e.reason == EMPTY_REASON:
                    raise
                logging.error("%s: %s", url, e)  # only this URL is dropped
                continue
            print(json.dumps({"url": url, "status": response.status_code, "proxy": response.proxy_label}), flush=True)
    except ProxyListError as e:
        logging.error("%s", e)
        sys.exit(1)


if __name__ == "__main__":
    main()
