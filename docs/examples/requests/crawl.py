"""Fetches the URLs it is given, one after another, each through a listed
proxy, and prints one JSON line per response.

    PYTHONPATH=../python:. python3 crawl.py --list /etc/proxies/proxies.json https://example.org/

Exits 1 when the list is missing at start, or has been empty for
--empty-timeout seconds in a row (proxy_list_empty). With --ban-pool, a
proxy that got --ban-threshold 403/429 answers from a domain is reported to
that pool as a ProxyBan (docs/pools.md "Reporting a banned proxy").
"""

import argparse
import json
import logging
import sys

from proxied_session import ProxiedSession
from proxylist import EMPTY_REASON, SERVICE_ACCOUNT_DIR, BanReporter, ProxyListError


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", default="/etc/proxies/proxies.json", help="proxies.json or proxies.txt")
    ap.add_argument("--reload-interval", type=float, default=5)
    ap.add_argument("--empty-timeout", type=float, default=300)
    ap.add_argument("--hold-delay", type=float, default=1)
    ap.add_argument("--log-interval", type=float, default=30)
    ap.add_argument("--backoff-base", type=float, default=30)
    ap.add_argument("--ban-pool", default="", help="the ProxyPool's name: report bans to it (docs/pools.md)")
    ap.add_argument("--ban-namespace", default="", help="the pool's namespace (default: the pod's)")
    ap.add_argument("--ban-threshold", type=int, default=3, help="403/429 answers of a domain through a proxy before a report")
    ap.add_argument("--ban-replace", action="store_true", help="ask the pool to replace a reported proxy")
    ap.add_argument("--ban-api", default="", help="the API server (default: KUBERNETES_SERVICE_HOST/PORT)")
    ap.add_argument("--ban-account-dir", default=SERVICE_ACCOUNT_DIR, help="token, ca.crt and namespace")
    ap.add_argument("urls", nargs="*")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    on_ban = None
    if args.ban_pool:
        try:
            on_ban = BanReporter(args.ban_pool, namespace=args.ban_namespace or None, threshold=args.ban_threshold,
                                 replace=args.ban_replace, api_url=args.ban_api or None, account_dir=args.ban_account_dir)
        except (ValueError, OSError) as e:
            logging.error("ban reports: %s", e)
            sys.exit(1)
    try:
        session = ProxiedSession(args.list, hold_delay=args.hold_delay, reload_interval=args.reload_interval,
                                 empty_timeout=args.empty_timeout, log_interval=args.log_interval,
                                 backoff_base=args.backoff_base, on_ban=on_ban)
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
