package recipes

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"crawl.example.com/proxy-operator/internal/testutil"
	"crawl.example.com/proxy-operator/pkg/squid/squidtest"
)

// examples is docs/examples of this checkout (go test runs in the
// package's directory).
var examples, _ = filepath.Abs("../../docs/examples")

// runLimit bounds every run of a recipe: startup on a loaded machine
// included, far above what a passing run takes.
const runLimit = 2 * time.Minute

// settings are a recipe's knobs, shortened so the tests are quick.
type settings struct {
	List         string
	Reload       time.Duration
	EmptyTimeout time.Duration
	Concurrency  int
	// Bans, when set, turns on the recipe's ban reports.
	Bans *banReports
}

// banReports is where a recipe reports bans: the pool, the API server and
// a directory laid out as a pod's service account (token, ca.crt,
// namespace).
type banReports struct {
	Pool, API, AccountDir string
	Threshold             int
}

func defaults(list string) settings {
	return settings{List: list, Reload: time.Second, EmptyTimeout: 30 * time.Second, Concurrency: 4}
}

const (
	holdDelay   = "0.2" // s between a held request's tries
	logInterval = "1"   // s between the ERRORs about held requests
)

func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) }

// recipe runs one of docs/examples on urls.
type recipe struct {
	name    string
	command func(t *testing.T, s settings, urls []string) *exec.Cmd
}

// python runs Debian's python3 (python3 on PATH may be another one without
// Scrapy) with the recipe directories on its path and nothing from the
// environment: no http_proxy could hide a direct request.
func python(t *testing.T, paths []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", args...)
	cmd.Dir = t.TempDir()
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + cmd.Dir, "LANG=C.UTF-8",
		"PYTHONPATH=" + strings.Join(paths, ":"), "PYTHONDONTWRITEBYTECODE=1"}
	return cmd
}

// requirePythonModules fails naming the Debian packages when Debian's
// python3 lacks one of modules.
func requirePythonModules(t *testing.T, modules ...string) {
	t.Helper()
	if out, err := exec.Command("/usr/bin/python3", "-c", "import "+strings.Join(modules, ", ")).CombinedOutput(); err != nil {
		t.Fatalf("Debian's python3 cannot import %v (apt-get install python3-scrapy python3-requests; make test-deps does): %v\n%s", modules, err, out)
	}
}

var scrapyRecipe = recipe{
	name: "scrapy",
	command: func(t *testing.T, s settings, urls []string) *exec.Cmd {
		requirePythonModules(t, "scrapy")
		cmd := python(t, []string{filepath.Join(examples, "python"), filepath.Join(examples, "scrapy")},
			"-m", "scrapy", "runspider", filepath.Join(examples, "scrapy", "example_spider.py"),
			"-a", "urls="+strings.Join(urls, ","),
			"-o", "-:jsonlines", // items on stdout, one JSON line per response like the other recipes
			"-s", "PROXYLIST_PATH="+s.List,
			"-s", "PROXYLIST_RELOAD_INTERVAL="+seconds(s.Reload),
			"-s", "PROXYLIST_EMPTY_TIMEOUT="+seconds(s.EmptyTimeout),
			"-s", "PROXYLIST_HOLD_DELAY="+holdDelay,
			"-s", "PROXYLIST_LOG_INTERVAL="+logInterval,
			"-s", "CONCURRENT_REQUESTS="+strconv.Itoa(s.Concurrency),
			"-s", "CONCURRENT_REQUESTS_PER_DOMAIN="+strconv.Itoa(s.Concurrency),
			"-s", "TELNETCONSOLE_ENABLED=0",
			"-s", "LOG_LEVEL=INFO")
		if b := s.Bans; b != nil {
			cmd.Args = append(cmd.Args, "-s", "PROXYLIST_BAN_POOL="+b.Pool, "-s", "PROXYLIST_BAN_API="+b.API,
				"-s", "PROXYLIST_BAN_ACCOUNT_DIR="+b.AccountDir, "-s", "PROXYLIST_BAN_THRESHOLD="+strconv.Itoa(b.Threshold))
		}
		return cmd
	},
}

var requestsRecipe = recipe{
	name: "requests",
	command: func(t *testing.T, s settings, urls []string) *exec.Cmd {
		requirePythonModules(t, "requests")
		args := []string{filepath.Join(examples, "requests", "crawl.py"),
			"--list", s.List,
			"--reload-interval", seconds(s.Reload),
			"--empty-timeout", seconds(s.EmptyTimeout),
			"--hold-delay", holdDelay,
			"--log-interval", logInterval}
		if b := s.Bans; b != nil {
			args = append(args, "--ban-pool", b.Pool, "--ban-api", b.API, "--ban-account-dir", b.AccountDir, "--ban-threshold", strconv.Itoa(b.Threshold))
		}
		return python(t, []string{filepath.Join(examples, "python"), filepath.Join(examples, "requests")}, append(args, urls...)...)
	},
}

var crawleeRecipe = recipe{
	name: "crawlee",
	command: func(t *testing.T, s settings, urls []string) *exec.Cmd {
		node, err := exec.LookPath("node")
		if err != nil {
			t.Fatalf("node not found: the Crawlee recipe needs Node.js 20 or newer: %v", err)
		}
		// node resolves imports from the script's own directory: a copy of
		// the recipe beside the cached node_modules, nothing in the clone.
		dir := t.TempDir()
		for _, f := range []string{"crawl.mjs", "proxylist.mjs"} {
			data, err := os.ReadFile(filepath.Join(examples, "crawlee", f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(crawleeModules(t), filepath.Join(dir, "node_modules")); err != nil {
			t.Fatal(err)
		}
		args := []string{"crawl.mjs", "--list", s.List,
			"--reload-interval", seconds(s.Reload),
			"--empty-timeout", seconds(s.EmptyTimeout),
			"--hold-delay", holdDelay,
			"--log-interval", logInterval,
			"--concurrency", strconv.Itoa(s.Concurrency)}
		if b := s.Bans; b != nil {
			args = append(args, "--ban-pool", b.Pool, "--ban-api", b.API, "--ban-account-dir", b.AccountDir, "--ban-threshold", strconv.Itoa(b.Threshold))
		}
		cmd := exec.Command(node, append(args, urls...)...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "NO_COLOR=1", "CRAWLEE_STORAGE_DIR=" + filepath.Join(dir, "storage")}
		return cmd
	},
}

// crawleeModules is the node_modules hack/crawlee-modules.sh installed for
// this package-lock.json (the tests run without the npm registry).
func crawleeModules(t *testing.T) string {
	t.Helper()
	lock, err := os.ReadFile(filepath.Join(examples, "crawlee", "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	dir := filepath.Join(cache, "proxy-operator", "crawlee", hex.EncodeToString(sum[:])[:16])
	if _, err := os.Stat(filepath.Join(dir, ".installed")); err != nil {
		t.Fatalf("Crawlee's node_modules for this package-lock.json are not in %s: run hack/crawlee-modules.sh (make test-deps does)", dir)
	}
	return filepath.Join(dir, "node_modules")
}

func TestScrapyRecipe(t *testing.T)   { runScenarios(t, scrapyRecipe) }
func TestRequestsRecipe(t *testing.T) { runScenarios(t, requestsRecipe) }
func TestCrawleeRecipe(t *testing.T)  { runScenarios(t, crawleeRecipe) }

// world is what every scenario crawls with: the origin and two squids.
type world struct {
	origin *origin
	a, b   proxy
}

func runScenarios(t *testing.T, r recipe) {
	records := map[string][]string{}
	for _, name := range siteNames {
		records[name] = []string{originAddr}
	}
	squidtest.ServeDNS(t, records)
	o := newOrigin(t)
	w := &world{origin: o, a: startProxy(t, "crawl-a-aaaaa", egressA, o.port), b: startProxy(t, "crawl-a-bbbbb", egressB, o.port)}
	for _, sc := range []struct {
		name string
		run  func(*testing.T, *world, recipe)
	}{
		{"without a list it refuses to start, naming the path", refusesWithoutList},
		{"an empty list holds requests until a proxy is published", holdsWhileEmpty},
		{"a list empty for longer than the bound ends the crawl with proxy_list_empty", givesUpWhenEmptyTooLong},
		{"a proxy removed from the list is not used after the reload", followsTheList},
		{"a proxy is not used for a domain it is banned on until the ban expires", honoursBannedDomains},
		{"a refusing or 407 proxy is skipped and the request retried through another", skipsDeadProxies},
	} {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, w, r) })
	}
}

// requireThrough fails unless every URL's path reached the origin, and
// every request under prefix came through one of the egress addresses:
// one from anywhere else went direct.
func requireThrough(t *testing.T, o *origin, prefix string, urls []string, egress ...string) []hit {
	t.Helper()
	hits := o.under(prefix)
	reached := map[string]bool{}
	for _, h := range hits {
		reached[h.Path] = true
		if !contains(egress, h.Source) {
			t.Errorf("%s reached the origin from %s, not through %v", h.Path, h.Source, egress)
		}
	}
	for _, u := range urls {
		if path := u[strings.Index(u[len("http://"):], "/")+len("http://"):]; !reached[path] {
			t.Errorf("%s never reached the origin", u)
		}
	}
	return hits
}

// okLine is the line each recipe prints for a response it handed to the
// crawler's code: {"url": ..., "status": 200, "proxy": ...}.
var okLine = regexp.MustCompile(`"status": ?200\b`)

// requireCompleted fails unless the recipe reports exactly n successful
// responses: a request that reached the origin but that the crawler then
// counted as failed is lost to the crawl all the same.
func requireCompleted(t *testing.T, p *process, n int) {
	t.Helper()
	out := p.output()
	if got := len(okLine.FindAllString(out, -1)); got != n {
		t.Errorf("the recipe reported %d successful responses, want %d:\n%s", got, n, out)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func refusesWithoutList(t *testing.T, w *world, r recipe) {
	d := newSecretDir(t) // mounted, nothing published yet
	s := defaults(d.path("proxies.json"))
	p := startProcess(t, r.command(t, s, w.origin.urls("", "/missing/", 2)))
	if code := p.wait(t, runLimit); code == 0 {
		t.Errorf("exit code 0, want non-zero without a list")
	}
	if out := p.output(); !strings.Contains(out, s.List) {
		t.Errorf("output does not name %s:\n%s", s.List, out)
	}
	if hits := w.origin.under("/missing/"); len(hits) > 0 {
		t.Errorf("requests were sent without a list: %+v", hits)
	}
}

func holdsWhileEmpty(t *testing.T, w *world, r recipe) {
	d := newSecretDir(t)
	d.publish(t) // no replica Ready yet
	s := defaults(d.path("proxies.txt"))
	urls := w.origin.urls("", "/held/", 6)
	p := startProcess(t, r.command(t, s, urls))
	p.waitUntil(t, runLimit, "complaining that the list is empty", func() bool {
		out := p.output()
		return strings.Contains(out, "ERROR") && strings.Contains(out, "empty") && strings.Contains(out, s.List)
	})
	time.Sleep(2 * time.Second) // the requests are held meanwhile
	if hits := w.origin.under("/held/"); len(hits) > 0 {
		t.Fatalf("requests reached the origin while the list was empty: %+v\n%s", hits, p.output())
	}
	d.publish(t, w.a.entry())
	if code := p.wait(t, runLimit); code != 0 {
		t.Errorf("exit code %d after the proxy was published:\n%s", code, p.output())
	}
	requireThrough(t, w.origin, "/held/", urls, egressA)
	requireCompleted(t, p, len(urls))
}

func givesUpWhenEmptyTooLong(t *testing.T, w *world, r recipe) {
	d := newSecretDir(t)
	d.publish(t)
	s := defaults(d.path("proxies.json"))
	s.EmptyTimeout = 3 * time.Second
	p := startProcess(t, r.command(t, s, w.origin.urls("", "/gave-up/", 3)))
	code := p.wait(t, runLimit)
	out := p.output()
	if code == 0 {
		t.Errorf("exit code 0 after the list stayed empty, want non-zero:\n%s", out)
	}
	if !strings.Contains(out, "proxy_list_empty") || !strings.Contains(out, s.List) {
		t.Errorf("output does not say proxy_list_empty with the path %s:\n%s", s.List, out)
	}
	if ran := time.Since(p.start); ran < s.EmptyTimeout {
		t.Errorf("gave up after %s, before the bound %s", ran, s.EmptyTimeout)
	}
	if hits := w.origin.under("/gave-up/"); len(hits) > 0 {
		t.Errorf("requests reached the origin: %+v", hits)
	}
}

func followsTheList(t *testing.T, w *world, r recipe) {
	d := newSecretDir(t)
	d.publish(t, w.a.entry())
	s := defaults(d.path("proxies.json"))
	s.Concurrency = 1
	urls := w.origin.urls("", "/slow/switch/", 60) // 150 ms each: 9 s
	p := startProcess(t, r.command(t, s, urls))
	p.waitUntil(t, runLimit, "5 requests through A", func() bool { return len(w.origin.under("/slow/switch/")) >= 5 })
	d.publish(t, w.b.entry()) // A drained, B published
	switched := time.Now()
	if code := p.wait(t, runLimit); code != 0 {
		t.Errorf("exit code %d:\n%s", code, p.output())
	}
	hits := requireThrough(t, w.origin, "/slow/switch/", urls, egressA, egressB)
	requireCompleted(t, p, len(urls))
	// The request in flight at the switch may still arrive; nothing later.
	cutoff := switched.Add(s.Reload + 2*time.Second)
	throughB := 0
	for _, h := range hits {
		if h.Source == egressA && h.At.After(cutoff) {
			t.Errorf("%s went through A %s after it left the list (reload interval %s)", h.Path, h.At.Sub(switched), s.Reload)
		}
		if h.Source == egressB {
			throughB++
		}
	}
	if throughB == 0 {
		t.Errorf("no request went through B, which replaced A")
	}
}

func honoursBannedDomains(t *testing.T, w *world, r recipe) {
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	d := newSecretDir(t)
	// Each domain has exactly one proxy it may use, so a ban ignored,
	// misapplied to a look-alike name, or an expired one honoured shows.
	d.publish(t,
		w.a.entry(ban{"banned.test", future}, ban{"expired.test", past}),
		w.b.entry(ban{"expired.test", future}, ban{"notbanned.test", future}))
	s := defaults(d.path("proxies.json"))
	s.EmptyTimeout = 20 * time.Second // a request held for good is dropped after this
	want := map[string]string{"banned.test": egressB, "www.banned.test": egressB, "expired.test": egressA, "notbanned.test": egressA}
	var urls []string
	for _, name := range siteNames {
		urls = append(urls, w.origin.urls(name, "/ban/"+name+"/", 3)...)
	}
	p := startProcess(t, r.command(t, s, urls))
	if code := p.wait(t, runLimit); code != 0 {
		t.Errorf("exit code %d:\n%s", code, p.output())
	}
	requireCompleted(t, p, len(urls))
	for _, h := range requireThrough(t, w.origin, "/ban/", urls, egressA, egressB) {
		name := strings.Split(h.Path, "/")[2]
		if h.Source != want[name] {
			t.Errorf("%s (host %s) came from %s, want %s", h.Path, h.Host, h.Source, want[name])
		}
	}
}

func skipsDeadProxies(t *testing.T, w *world, r recipe) {
	refused := fmt.Sprintf("http://nobody:%s@127.0.0.1:%d", strings.Repeat("x", 16), testutil.FreePort(t))
	wrongPassword := strings.Replace(w.a.URL, "@", "wrong@", 1)
	d := newSecretDir(t)
	d.publish(t, entry{Name: "refuses", URL: refused}, entry{Name: "wrong-password", URL: wrongPassword}, w.b.entry())
	s := defaults(d.path("proxies.json"))
	urls := w.origin.urls("", "/dead/", 6)
	p := startProcess(t, r.command(t, s, urls))
	if code := p.wait(t, runLimit); code != 0 {
		t.Errorf("exit code %d:\n%s", code, p.output())
	}
	requireThrough(t, w.origin, "/dead/", urls, egressB)
	requireCompleted(t, p, len(urls))
	out := p.output()
	for _, name := range []string{"refuses", "wrong-password"} {
		if !strings.Contains(out, "proxy "+name+" is dead") {
			t.Errorf("output does not say proxy %s is dead:\n%s", name, out)
		}
	}
	for _, u := range []string{w.a.URL, w.b.URL} {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		if pw, _ := parsed.User.Password(); strings.Contains(out, pw) {
			t.Errorf("a proxy's password is in the output")
		}
	}
}
