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
//   handed to reportBan;
// - a proxy is not used for a host under one of its bannedDomains until
//   the ban expires.
import { readFileSync, realpathSync, statSync } from 'node:fs';

export const DEFAULT_PATH = '/etc/proxies/proxies.json';
export const EMPTY_REASON = 'proxy_list_empty';

export class ProxyListError extends Error {
    constructor(message, reason = 'proxy_list_unreadable') {
        super(message);
        this.reason = reason;
    }
}

// Hook: called for every 403/429 a site answered through proxy. Reporting
// bans to the operator (annotating the Proxy, docs/pools.md "Reporting a
// banned proxy") comes later; pass onBan to ProxyList to do it now.
export function reportBan(proxy, domain, status, count) {} // eslint-disable-line no-unused-vars

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
        log = { info: console.log, warning: console.warn, error: console.error }, onBan = reportBan,
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
        this.onBan(proxy, host, status, count);
    }
}
