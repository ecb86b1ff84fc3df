# Settings for proxylist_middleware.ProxyListMiddleware: merge them into
# your project's settings.py. The values are the defaults.
DOWNLOADER_MIDDLEWARES = {
    # Before HttpProxyMiddleware (750), which turns the credential in
    # meta["proxy"] into Proxy-Authorization.
    "proxylist_middleware.ProxyListMiddleware": 610,
}
# proxies.json of the pool's Secret mounted as a directory (proxies.txt
# works too, without bannedDomains).
PROXYLIST_PATH = "/etc/proxies/proxies.json"
PROXYLIST_RELOAD_INTERVAL = 5  # s between checks of the file (the kubelet swaps it)
PROXYLIST_EMPTY_TIMEOUT = 300  # s of an empty list in a row before closing: proxy_list_empty
PROXYLIST_HOLD_DELAY = 1  # s a held request waits before it asks again
PROXYLIST_LOG_INTERVAL = 30  # s between ERRORs about held requests
PROXYLIST_BACKOFF_BASE = 30  # s a proxy stays dead after its first 407 or refused connection
PROXYLIST_BACKOFF_CAP = 600  # s, the longest (the backoff doubles per failure)
PROXYLIST_RETRY_TIMES = 5  # retries through another proxy after a dead one
# Ban reports (docs/pools.md "Reporting a banned proxy"): the ProxyPool's
# name turns them on; the pod's service account needs crawl-ban-reporter-role.
PROXYLIST_BAN_POOL = ""  # e.g. "crawl-a"; empty: ban signals are only counted and logged
PROXYLIST_BAN_NAMESPACE = ""  # empty: the pod's own namespace
PROXYLIST_BAN_THRESHOLD = 3  # 403/429 answers of one domain through one proxy before it is reported
PROXYLIST_BAN_REPLACE = False  # True: ask the pool to replace the proxy, not only keep it off the domain
PROXYLIST_BAN_API = ""  # empty: the API server from KUBERNETES_SERVICE_HOST/PORT
PROXYLIST_BAN_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # token, ca.crt, namespace
