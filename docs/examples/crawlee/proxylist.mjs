// The list a ProxyPool publishes, read so that no request ever goes direct:
// the JavaScript twin of docs/examples/python/proxylist.py, with the same
// promises (docs/pools.md, "Using the list from a crawler"):
//
// - a missing or unreadable list at start is an error naming the path;
// - an empty list holds requests (acquire returns undefined: wait and ask
//   again); after emptyTimeout seconds of uninterrupted emptiness acquire
//   throws a ProxyListError with reason "proxy_list_empty": stop crawling;
// - the file is re-read every reloadInterval seconds, following the symlink
//   the kubelet swaps (..data), so a drained proxy stops being used;
// - 407 or a refused connection marks a proxy dead (exponential backoff);
//   403/429 from a site is a ban signal counted per proxy and domain and
//   handed to onBan, e.g. a BanReporter's, which reports the ban to the
//   operator as a ProxyBan (docs/pools.md "Reporting a banned proxy");
// - a proxy is not used for a host under one of its bannedDomains until
//   the ban expires.
import { readFileSync, realpathSync, statSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import { join } from 'node:path';

export const DEFAULT_PATH = '/etc/proxies/proxies.json';
export const EMPTY_REASON = 'proxy_list_empty';
export const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

export class ProxyListError extends Error {
    constructor(message, reason = 'proxy_list_unreadable') {
        super(message);
        this.reason = reason;
    }
}

// BanReporter reports bans to the operator, as proxylist.py's does: once a
// proxy has had threshold 403/429 answers from a domain, a ProxyBan naming
// the pool, the proxy (its name in proxies.json), the domain and
// "HTTP <status> x<count>" is created in the pool's namespace through the
// Kubernetes API with the pod's service account (bound to the ClusterRole
// crawl-ban-reporter-role). Once per proxy and domain; never awaited by the
// crawl and never failing it: a refusal is logged with the API's message,
// which names the field. The token is read at each report (the kubelet
// rotates it) and never logged. Pass reporter.onBan to ProxyList.
export class BanReporter {
    constructor(pool, {
        namespace, threshold = 3, replace = false, apiUrl, accountDir = SERVICE_ACCOUNT_DIR, timeout = 10,
        log = { warning: console.warn, error: console.error },
    } = {}) {
        if (!pool) throw new Error("BanReporter: pool (the ProxyPool's name) is required");
        if (!apiUrl) {
            const host = process.env.KUBERNETES_SERVICE_HOST;
            const port = process.env.KUBERNETES_SERVICE_PORT ?? '443';
            if (!host) throw new Error('BanReporter: no apiUrl and KUBERNETES_SERVICE_HOST is not set (not in a pod)');
            apiUrl = host.includes(':') ? `https://[${host}]:${port}` : `https://${host}:${port}`;
        }
        namespace ||= readFileSync(join(accountDir, 'namespace'), 'utf8').trim();
        Object.assign(this, {
            pool, namespace, threshold: Math.max(1, threshold), replace, apiUrl: apiUrl.replace(/\/+$/, ''), accountDir, timeout, log,
        });
        this.reported = new Set();
        this.onBan = this.onBan.bind(this);
    }

    onBan(proxy, domain, status, count) {
        domain = (domain ?? '').toLowerCase().replace(/\.$/, '');
        if (count < this.threshold || !domain) return;
        if (!proxy.name) {
            this.log.error(`cannot report proxy ${label(proxy)} banned on ${domain}: the list has no names (read proxies.json, not proxies.txt)`);
            return;
        }
        const key = `${proxy.name} ${domain}`;
        if (this.reported.has(key)) return;
        this.reported.add(key);
        this.report(proxy.name, domain, `HTTP ${status} x${count}`);
    }

    // report creates the ProxyBan; resolves to its name, or undefined when it failed.
    report(proxy, domain, reason) {
        const body = JSON.stringify({
            apiVersion: 'crawl.example.com/v1alpha1', kind: 'ProxyBan', metadata: { generateName: `${this.pool}-ban-` },
            spec: { pool: this.pool, proxy, domain, reason, replace: this.replace },
        });
        const failed = (why) => {
            this.log.error(`reporting proxy ${proxy} banned on ${domain}: ${why}`);
            return undefined;
        };
        return new Promise((resolve) => {
            let req;
            try {
                const token = readFileSync(join(this.accountDir, 'token'), 'utf8').trim();
                const ca = readFileSync(join(this.accountDir, 'ca.crt'));
                const url = new URL(`${this.apiUrl}/apis/crawl.example.com/v1alpha1/namespaces/${this.namespace}/proxybans`);
                req = httpsRequest(url, {
                    method: 'POST', ca, timeout: this.timeout * 1000,
                    headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json', Accept: 'application/json' },
                }, (res) => {
                    let text = '';
                    res.setEncoding('utf8');
                    res.on('data', (chunk) => { text += chunk; });
                    res.on('end', () => {
                        let answer = {};
                        try { answer = JSON.parse(text); } catch { /* not JSON: the status says enough */ }
                        if (res.statusCode !== 201 && res.statusCode !== 200) {
                            resolve(failed(`the API refused it (${res.statusCode}): ${answer.message ?? res.statusMessage}`));
                            return;
                        }
                        const name = answer.metadata?.name;
                        this.log.warning(`reported proxy ${proxy} banned on ${domain} (${reason}) to pool ${this.namespace}/${this.pool}: ProxyBan ${name}`);
                        resolve(name);
                    });
                });
            } catch (e) {
                resolve(failed(e.message));
                return;
            }
            req.on('timeout', () => req.destroy(new Error(`no answer in ${this.timeout} s`)));
            req.on('error', (e) => resolve(failed(e.message)));
            req.end(body);
        });
    }
}

export function stripCredentials(url) {
    const u = new URL(url);
    u.username = '';
    u.password = '';
    return u.origin;
}

function parseBans(entries) {
    const bans = new Map();
    for (const b of entries ?? []) {
        const domain = String(b?.domain ?? '').toLowerCase().replace(/^\.+|\.+$/g, '');
        if (!domain) continue;
        let expires = Date.parse(b.expiresAt);
        if (Number.isNaN(expires)) expires = Infinity; // a ban we cannot date is honoured
        bans.set(domain, Math.max(expires, bans.get(domain) ?? expires));
    }
    return bans;
}

// parse returns the proxies in text, read from path (.json or lines).
export function parse(path, text) {
    if (path.endsWith('.json')) {
        const entries = text.trim() ? JSON.parse(text) : [];
        if (!Array.isArray(entries)) throw new Error('want a JSON array of proxies');
        return entries.map((e, i) => {
            if (typeof e?.url !== 'string' || !e.url) throw new Error(`entry ${i}: want an object with a url`);
            return { url: e.url, name: e.name ?? '', bans: parseBans(e.bannedDomains) };
        });
    }
    return text.split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('#'))
        .map((url) => ({ url, name: '', bans: new Map() }));
}

export const label = (proxy) => proxy.name || stripCredentials(proxy.url);

function bannedFor(proxy, host, now) {
    host = (host ?? '').toLowerCase().replace(/\.$/, '');
    for (const [domain, expires] of proxy.bans) {
        if ((host === domain || host.endsWith(`.${domain}`)) && expires > now) return true;
    }
    return false;
}

export class ProxyList {
    constructor(path = DEFAULT_PATH, {
        reloadInterval = 5, emptyTimeout = 300, logInterval = 30, backoffBase = 30, backoffCap = 600,
        log = { info: console.log, warning: console.warn, error: console.error }, onBan,
    } = {}) {
        Object.assign(this, { path, reloadInterval, emptyTimeout, logInterval, backoffBase, backoffCap, log, onBan });
        this.proxies = [];
        this.banCounts = new Map(); // "proxy domain" -> 403/429 answers
        this.next = 0; // round robin
        this.seen = undefined; // target, inode, mtime, size last read
        this.dead = new Map(); // url -> { failures, until }, kept across reloads
        this.emptySince = undefined;
        this.lastComplaint = undefined;
        try {
            this.load();
        } catch (e) {
            throw new ProxyListError(`proxy list ${path}: ${e.message}; refusing to start: without it every request `
                + 'would go out directly (mount the pool\'s Secret <pool>-proxies as a directory, see docs/pools.md)');
        }
    }

    load() {
        const target = realpathSync(this.path);
        const st = statSync(target, { bigint: true });
        const seen = `${target} ${st.ino} ${st.mtimeNs} ${st.size}`;
        this.checked = Date.now();
        if (seen === this.seen) return;
        const fresh = parse(this.path, readFileSync(target, 'utf8'));
        this.seen = seen;
        if (fresh.map((p) => p.url).join('\n') !== this.proxies.map((p) => p.url).join('\n')) {
            this.log.info(`proxy list ${this.path}: ${fresh.length} proxies (${fresh.map(label).join(', ') || 'none'})`);
        }
        this.proxies = fresh;
        this.noteEmptiness();
    }

    noteEmptiness() {
        if (this.proxies.length > 0) {
            if (this.emptySince !== undefined) {
                this.log.info(`proxy list ${this.path} has proxies again after ${Math.round((Date.now() - this.emptySince) / 1000)} s empty`);
            }
            this.emptySince = undefined;
        } else if (this.emptySince === undefined) {
            this.emptySince = Date.now();
        }
    }

    reloadIfDue() {
        if (Date.now() - this.checked < this.reloadInterval * 1000) return;
        try {
            this.load();
        } catch (e) {
            // Gone or garbled after start: as good as empty, never direct.
            if (this.proxies.length > 0 || this.seen !== undefined) {
                this.log.error(`proxy list ${this.path}: ${e.message}; treating it as empty`);
            }
            this.proxies = [];
            this.seen = undefined;
            this.noteEmptiness();
        }
    }

    // choose returns the next proxy for a request to host, or undefined.
    choose(host) {
        this.reloadIfDue();
        const now = Date.now();
        const allowed = this.proxies.filter((p) => !bannedFor(p, host, now));
        if (allowed.length === 0) return undefined;
        const deadUntil = (p) => this.dead.get(p.url)?.until ?? 0;
        const alive = allowed.filter((p) => deadUntil(p) <= now);
        if (alive.length === 0) {
            // All dead: try the one whose backoff ends first rather than none.
            return allowed.reduce((a, b) => (deadUntil(b) < deadUntil(a) ? b : a));
        }
        this.next += 1;
        return alive[this.next % alive.length];
    }

    // acquire returns a proxy for host, or undefined: hold the request and
    // ask again. waited is how long (s) this request has been held.
    acquire(host, waited) {
        const proxy = this.choose(host);
        if (proxy) return proxy;
        const empty = this.emptyFor();
        if (empty !== undefined && empty >= this.emptyTimeout) {
            throw new ProxyListError(`${EMPTY_REASON}: proxy list ${this.path} has been empty for ${Math.round(empty)} s `
                + `(bound ${this.emptyTimeout} s); giving up rather than sending requests directly`, EMPTY_REASON);
        }
        if (this.proxies.length > 0 && waited >= this.emptyTimeout) {
            throw new ProxyListError(`every proxy in ${this.path} is banned for ${host} and has been for `
                + `${Math.round(waited)} s; dropping the request rather than sending it directly`, 'proxy_banned');
        }
        return undefined;
    }

    emptyFor() {
        return this.emptySince === undefined ? undefined : (Date.now() - this.emptySince) / 1000;
    }

    // complainHeld logs, at most every logInterval seconds, that requests wait.
    complainHeld(host, held) {
        const now = Date.now();
        if (this.lastComplaint !== undefined && now - this.lastComplaint < this.logInterval * 1000) return;
        this.lastComplaint = now;
        const empty = this.emptyFor();
        if (empty !== undefined) {
            this.log.error(`proxy list ${this.path} is empty (for ${Math.round(empty)} s): holding ${held} request(s); `
                + `giving up after ${this.emptyTimeout} s`);
        } else {
            this.log.error(`proxy list ${this.path}: every proxy is banned for ${host}: holding ${held} request(s)`);
        }
    }

    find(url) {
        return this.proxies.find((p) => p.url === url);
    }

    markDead(proxy, why) {
        const failures = (this.dead.get(proxy.url)?.failures ?? 0) + 1;
        const backoff = Math.min(this.backoffCap, this.backoffBase * 2 ** (failures - 1));
        this.dead.set(proxy.url, { failures, until: Date.now() + backoff * 1000 });
        this.log.warning(`proxy ${label(proxy)} is dead for ${backoff} s: ${why}`);
    }

    markAlive(proxy) {
        this.dead.delete(proxy.url);
    }

    recordBan(proxy, host, status) {
        const key = `${label(proxy)} ${(host ?? '').toLowerCase()}`;
        const count = (this.banCounts.get(key) ?? 0) + 1;
        this.banCounts.set(key, count);
        this.log.warning(`proxy ${label(proxy)} got ${status} from ${host} (${count} so far)`);
        // onBan(proxy, domain, status, count), e.g. a BanReporter's; none:
        // counted and logged only.
        this.onBan?.(proxy, host, status, count);
    }
}
