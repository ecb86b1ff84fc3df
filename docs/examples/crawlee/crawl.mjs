// Fetches the URLs it is given with Crawlee's HttpCrawler, each through a
// proxy of the pool's list, never direct, and prints one JSON line per
// response.
//
//   node crawl.mjs --list /etc/proxies/proxies.json https://example.org/
//
// Exits 1 when the list is missing at start, or has been empty for
// --empty-timeout seconds in a row (proxy_list_empty). With --ban-pool, a
// proxy that got --ban-threshold 403/429 answers from a domain is reported
// to that pool as a ProxyBan (docs/pools.md "Reporting a banned proxy").
//
// Crawlee sends a request without a proxy when newUrlFunction returns
// nothing, so it never does: with no usable proxy it waits, asking again
// every --hold-delay seconds, and after a while throws RetryRequestError,
// which puts the request back in the queue without spending its retries.
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import {
    CriticalError, HttpCrawler, NonRetryableError, ProxyConfiguration, RetryRequestError, log,
} from '@crawlee/http';
import {
    BanReporter, DEFAULT_PATH, EMPTY_REASON, ProxyList, ProxyListError, SERVICE_ACCOUNT_DIR, label,
} from './proxylist.mjs';

const { values: opts, positionals: urls } = parseArgs({
    allowPositionals: true,
    options: {
        list: { type: 'string', default: DEFAULT_PATH },
        'reload-interval': { type: 'string', default: '5' },
        'empty-timeout': { type: 'string', default: '300' },
        'hold-delay': { type: 'string', default: '1' },
        'log-interval': { type: 'string', default: '30' },
        'backoff-base': { type: 'string', default: '30' },
        concurrency: { type: 'string', default: '4' },
        'ban-pool': { type: 'string', default: '' }, // the ProxyPool's name: report bans to it
        'ban-namespace': { type: 'string', default: '' }, // default: the pod's
        'ban-threshold': { type: 'string', default: '3' },
        'ban-replace': { type: 'boolean', default: false },
        'ban-api': { type: 'string', default: '' }, // default: KUBERNETES_SERVICE_HOST/PORT
        'ban-account-dir': { type: 'string', default: SERVICE_ACCOUNT_DIR }, // token, ca.crt, namespace
    },
});

let proxies;
try {
    const reporter = opts['ban-pool'] ? new BanReporter(opts['ban-pool'], {
        namespace: opts['ban-namespace'], threshold: Number(opts['ban-threshold']), replace: opts['ban-replace'],
        apiUrl: opts['ban-api'], accountDir: opts['ban-account-dir'], log,
    }) : undefined;
    proxies = new ProxyList(opts.list, {
        onBan: reporter?.onBan,
        reloadInterval: Number(opts['reload-interval']),
        emptyTimeout: Number(opts['empty-timeout']),
        logInterval: Number(opts['log-interval']),
        backoffBase: Number(opts['backoff-base']),
        log,
    });
} catch (e) {
    log.error(e.message);
    process.exit(1);
}

const holdDelay = Number(opts['hold-delay']) * 1000;
const holdRound = 20_000;
let held = 0;
let gaveUp;

const proxyConfiguration = new ProxyConfiguration({
    newUrlFunction: async (sessionId, { request } = {}) => {
        const host = new URL(request.url).hostname;
        const state = request.userData.proxylist ??= { since: Date.now(), holds: 0 };
        // Held here, asking every --hold-delay, for up to holdRound; then
        // back to the queue (Crawlee's requestHandlerTimeoutSecs, 60 s by
        // default, bounds one round).
        const roundEnd = Date.now() + holdRound;
        let proxy;
        held += 1;
        try {
            for (;;) {
                try {
                    proxy = proxies.acquire(host, (Date.now() - state.since) / 1000);
                } catch (e) {
                    if (!(e instanceof ProxyListError)) throw e;
                    if (e.reason === EMPTY_REASON) {
                        gaveUp ??= e;
                        throw new CriticalError(e.message); // stops the crawler
                    }
                    throw new NonRetryableError(e.message); // drops this request only
                }
                if (proxy) break;
                proxies.complainHeld(host, held);
                if (Date.now() >= roundEnd) {
                    state.holds += 1;
                    throw new RetryRequestError(`no usable proxy for ${host} in ${opts.list}: request held`);
                }
                await sleep(holdDelay);
            }
        } finally {
            held -= 1;
        }
        // Holding spent retries the request may need for real failures.
        request.retryCount = Math.max(0, request.retryCount - state.holds);
        delete request.userData.proxylist;
        return proxy.url;
    },
});

const crawler = new HttpCrawler({
    proxyConfiguration,
    maxConcurrency: Number(opts.concurrency),
    maxRequestRetries: 5,
    additionalHttpErrorStatusCodes: [407], // a proxy refusing our credential: dead, retry elsewhere
    ignoreHttpErrorStatusCodes: [403, 429], // the site's answer: a ban signal, handled below
    // Crawlee's session pool would otherwise take 401/403/429 as "blocked"
    // and fail the request before requestHandler sees it: no ban signal.
    sessionPoolOptions: { blockedStatusCodes: [] },
    async requestHandler({ request, response, proxyInfo }) {
        const proxy = proxies.find(proxyInfo.url);
        if (proxy) {
            proxies.markAlive(proxy);
            if (response.statusCode === 403 || response.statusCode === 429) {
                proxies.recordBan(proxy, new URL(request.url).hostname, response.statusCode);
            }
        }
        console.log(JSON.stringify({ url: request.url, status: response.statusCode, proxy: proxy ? label(proxy) : '' }));
    },
    async errorHandler({ proxyInfo }, error) {
        const proxy = proxyInfo && proxies.find(proxyInfo.url);
        if (proxy && isProxyFailure(error)) proxies.markDead(proxy, error.message.split('\n')[0]);
    },
});

// isProxyFailure: the connection to the proxy failed or it refused the
// credential (through a proxy, a site's own failures come back as responses).
function isProxyFailure(error) {
    return ['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENOTFOUND'].includes(error.code)
        || /^407\b|\b407\b.*proxy|proxy.*\b407\b/i.test(error.message)
        || /ECONNREFUSED/.test(error.message);
}

try {
    await crawler.run(urls);
} catch (e) {
    if (!gaveUp) throw e;
}
if (gaveUp) {
    log.error(gaveUp.message);
    process.exit(1);
}
